"""The only module that talks to the Kubernetes API.

Who calls it: the writers (`workload_check.py`, `reservations.py`, `ungating/ungater.py`,
`check_config.py`, `events.py`), the lists of `watches.py` and the watch streams of
`informer.py` (each on a thread of its own), always from a worker thread
(`asyncio.to_thread`): the official client is synchronous and the event loop must stay free
for the watch streams' events and the webhook.

Objects go in and come out as plain dicts (the same shapes as a `kubectl get -o yaml` dump),
through one generic request on the official client's ApiClient, so the translation code
reads live objects and dumps alike. `dry_run` turns every write into a logged no-op.
"""

from __future__ import annotations

import builtins
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from nexus_admit.kube import labels as L

__all__ = [
    "FIELD_MANAGER",
    "RESOURCES",
    "ApiException",
    "KubeApi",
    "NotLeading",
    "Resource",
    "load_api_client",
]

log = logging.getLogger(__name__)

FIELD_MANAGER = "nexus-admit"
_APPLY = "application/apply-patch+yaml"
_MERGE = "application/merge-patch+json"
_STRATEGIC = "application/strategic-merge-patch+json"


@dataclass(frozen=True, slots=True)
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        ns = f"/namespaces/{quote(namespace)}" if self.namespaced and namespace else ""
        tail = f"/{quote(name)}" if name else ""
        return f"{root}{ns}/{self.plural}{tail}" + (f"/{sub}" if sub else "")


RESOURCES: dict[str, Resource] = {
    "Node": Resource("", "v1", "nodes", False),
    "Pod": Resource("", "v1", "pods", True),
    "Event": Resource("events.k8s.io", "v1", "events", True),
    "Job": Resource("batch", "v1", "jobs", True),
    "Workload": Resource(L.KUEUE_API_GROUP, L.KUEUE_API_VERSION, "workloads", True),
    "LocalQueue": Resource(L.KUEUE_API_GROUP, L.KUEUE_API_VERSION, "localqueues", True),
    "ClusterQueue": Resource(L.KUEUE_API_GROUP, L.KUEUE_API_VERSION, "clusterqueues", False),
    "ResourceFlavor": Resource(L.KUEUE_API_GROUP, L.KUEUE_API_VERSION, "resourceflavors", False),
    "Topology": Resource(L.KUEUE_API_GROUP, L.KUEUE_API_VERSION, "topologies", False),
    "AdmissionCheck": Resource(L.KUEUE_API_GROUP, L.KUEUE_API_VERSION, "admissionchecks", False),
    "NodeResourceTopology": Resource(
        L.NRT_API_GROUP, L.NRT_API_VERSION, "noderesourcetopologies", False
    ),
    "ResourceSlice": Resource(L.DRA_API_GROUP, "v1", "resourceslices", False),
    "ResourceClaim": Resource(L.DRA_API_GROUP, "v1", "resourceclaims", True),
    "ResourceClaimTemplate": Resource(L.DRA_API_GROUP, "v1", "resourceclaimtemplates", True),
    "DeviceTaintRule": Resource(L.DRA_API_GROUP, "v1", "devicetaintrules", False),
    "ResourceReservation": Resource(L.API_GROUP, L.API_VERSION, "resourcereservations", True),
    "PlacementConfig": Resource(L.API_GROUP, L.API_VERSION, "placementconfigs", False),
    "RuntimeClass": Resource("node.k8s.io", "v1", "runtimeclasses", False),
    "LimitRange": Resource("", "v1", "limitranges", True),
    "Lease": Resource("coordination.k8s.io", "v1", "leases", True),
    "ConfigMap": Resource("", "v1", "configmaps", True),
    "StatefulSet": Resource("apps", "v1", "statefulsets", True),
    # owners a pod's owner chain passes through on its way to its Workload's owner
    # (`controller/pod_owners.py`), read one at a time
    "ReplicaSet": Resource("apps", "v1", "replicasets", True),
    "JobSet": Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", True),
    "RayCluster": Resource("ray.io", "v1", "rayclusters", True),
}

# how often an expired continue token restarts a paginated list before one unpaginated
# list is made (client-go's pager falls back to a full list at once)
LIST_RESTARTS = 2
FULL_LIST_TIMEOUT_FACTOR = 4

# a lease call must answer well within the renew deadline (10 s by default)
LEASE_TIMEOUT_SECONDS = 4.0


class NotLeading(RuntimeError):
    """A write refused before it was sent: this replica does not hold the leader Lease."""


# Blocking API calls run in worker threads (`asyncio.to_thread`): the ungater's pin
# patches, status writes and Events go out many at a time, and the placing loop's own
# calls must never queue behind them. `operator.run` sizes the loop's executor to this, and
# the client keeps as many connections (urllib3 would otherwise keep 5 per core and open a
# new TLS connection for every request above that).
API_THREADS = 32

# a watch stream is read this many bytes at a time (an event is handed on once its line is
# complete), and the client's read timeout is the stream's own timeout plus this margin
WATCH_CHUNK_BYTES = 65536
WATCH_READ_MARGIN = 30


def load_api_client(kubeconfig: str | None, pool_size: int = API_THREADS) -> client.ApiClient:
    """A client for `kubeconfig`, else $KUBECONFIG / ~/.kube/config, else in-cluster, that
    keeps `pool_size` connections."""
    cfg = client.Configuration()
    cfg.connection_pool_maxsize = pool_size
    api: client.ApiClient
    if kubeconfig:
        api = config.new_client_from_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        return api
    try:
        api = config.new_client_from_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        api = client.ApiClient(cfg)
    return api


class KubeApi:
    """Plain-dict reads and writes on the official client. Thread-safe for concurrent
    calls (the client's connection pool is)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        dry_run: bool = False,
        timeout: float = 30,
        list_page_size: int = 500,
        list_page_timeout: float = 30,
    ):
        self.client = api_client
        self.dry_run = dry_run
        self.timeout = timeout
        # lists read `list_page_size` objects per request (0: all in one), each request
        # bounded by `list_page_timeout` seconds
        self.list_page_size = list_page_size
        self.list_page_timeout = list_page_timeout
        # with leader election: asked right before every write is sent, so a replica that
        # lost the Lease writes nothing, not even a write queued before it noticed
        self.write_guard: Callable[[], bool] | None = None
        # with leader election: a guarded write gives up after this long, here and in the
        # apiserver (the request's `timeout` parameter), so one sent while leading cannot
        # land after the Lease may have passed to another replica (the margin between the
        # renew deadline and the Lease's duration); None: `timeout`
        self.write_timeout: float | None = None

    # ---- the one request ----
    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        query: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        params = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.client.call_api(*params, _request_timeout=timeout or self.timeout)
        response.read()  # type: ignore[no-untyped-call]
        data = self.client.response_deserialize(response, {"2XX": "object"}).data
        return data if isinstance(data, dict) else {}

    def _write(
        self, what: str, method: str, path: str, *, guarded: bool = True, **kw: Any
    ) -> dict[str, Any]:
        if guarded and self.write_guard is not None and not self.write_guard():
            raise NotLeading(f"not the leader: did not {what}")
        if self.dry_run:
            log.info("dry-run: would %s (%s %s)", what, method, path)
            return {}
        if guarded and self.write_timeout is not None:
            kw.setdefault("timeout", self.write_timeout)
            # the same bound on the apiserver's side: it ends its own handling (admission,
            # storage) then, so a request it holds (a slow webhook, etcd) cannot be stored
            # after we gave up, when the Lease may be another replica's
            kw["query"] = {**(kw.get("query") or {}), "timeout": f"{self.write_timeout:g}s"}
        return self.request(method, path, **kw)

    # ---- reads ----
    def list(
        self, kind: str, keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    ) -> tuple[list[dict[str, Any]], int | None]:
        """Every object of `kind` and the list's resourceVersion; [] when the API does not
        serve the kind (e.g. no DRA, no NRT CRD). Read in pages of `list_page_size`, each
        with its own `list_page_timeout`, so no one request carries the whole fleet; `keep`
        turns each object into what the caller keeps as its page arrives (a page's raw
        objects are dropped before the next is read). A continue token that expired
        mid-list (410 Gone: etcd compacted past the list's revision) restarts the list,
        `LIST_RESTARTS` times, then one unpaginated list answers."""
        for _ in range(LIST_RESTARTS):
            try:
                return self._list_pages(kind, keep, self.list_page_size)
            except ApiException as e:
                if e.status != 410:
                    raise
                log.warning("list of %s: continue token expired; listing again", kind)
        return self._list_pages(kind, keep, 0)

    def _list_pages(
        self, kind: str, keep: Callable[[dict[str, Any]], dict[str, Any]] | None, page_size: int
    ) -> tuple[builtins.list[dict[str, Any]], int | None]:
        res = RESOURCES[kind]
        out: builtins.list[dict[str, Any]] = []
        version: int | None = None
        token = ""
        first = True
        # the unpaginated fallback carries the whole kind in one answer
        timeout = self.list_page_timeout * (1 if page_size else FULL_LIST_TIMEOUT_FACTOR)
        while first or token:
            query = {"limit": str(page_size)} if page_size else {}
            if token:
                query["continue"] = token
            try:
                doc = self.request("GET", res.path(), query=query, timeout=timeout)
            except ApiException as e:
                if e.status == 404 and first:
                    return [], None
                raise
            page_meta = doc.get("metadata") or {}
            if first:  # every page is read at the first page's revision
                rv = str(page_meta.get("resourceVersion") or "")
                version = int(rv) if rv.isdigit() else None
            first = False
            for it in doc.pop("items", None) or []:
                it.setdefault("kind", kind)  # list items carry no kind
                it.setdefault("apiVersion", res.api_version)
                out.append(keep(it) if keep is not None else it)
            token = str(page_meta.get("continue") or "")
        return out, version

    def watch(
        self, kind: str, version: str, timeout_seconds: int
    ) -> Iterator[dict[str, Any]]:
        """The watch events of `kind` after resourceVersion `version` ({"type", "object"},
        BOOKMARKs and ERRORs included), as the apiserver sends them, until it ends the
        stream after `timeout_seconds`. The caller iterates in a thread of its own: each
        event is read as it arrives (one JSON document a line). Raises ApiException when the
        apiserver refuses the watch itself."""
        res = RESOURCES[kind]
        query = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": version,
            "timeoutSeconds": str(timeout_seconds),
        }
        params = self.client.param_serialize(
            method="GET",
            resource_path=res.path(),
            query_params=list(query.items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        # connect as any request; then a read may wait the whole stream for the next event
        answer = self.client.call_api(
            *params, _request_timeout=(self.timeout, timeout_seconds + WATCH_READ_MARGIN)
        )
        raw = answer.response
        try:
            if not 200 <= answer.status < 300:
                raise ApiException(status=answer.status, reason=answer.reason,
                                   body=raw.data.decode("utf-8", "replace")[:500])
            pending = b""
            for chunk in raw.stream(WATCH_CHUNK_BYTES, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        if isinstance(event, dict):
                            yield event
        finally:
            raw.release_conn()

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.request("GET", RESOURCES[kind].path(namespace, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    # ---- writes ----
    def create(self, kind: str, body: Mapping[str, Any]) -> bool:
        """Create; False when it already exists (deterministic names: that means done)."""
        m = body.get("metadata") or {}
        try:
            self._write(
                f"create {kind} {m.get('namespace', '')}/{m.get('name')}",
                "POST",
                RESOURCES[kind].path(m.get("namespace")),
                body=dict(body),
            )
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    def delete(self, kind: str, name: str, namespace: str | None = None) -> bool:
        try:
            self._write(
                f"delete {kind} {namespace or ''}/{name}",
                "DELETE",
                RESOURCES[kind].path(namespace, name),
            )
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    def apply_status(
        self, kind: str, body: Mapping[str, Any], *, guarded: bool = True
    ) -> dict[str, Any]:
        """Server-side apply of the status fields in `body` under our own field manager: only
        the fields we set are ours (e.g. one entry of a Workload's admissionChecks).
        `guarded=False` only for what a follower may write: the AdmissionCheck's Active
        condition when no replica leads (`controller/degraded.py`)."""
        m = body.get("metadata") or {}
        return self._write(
            f"apply {kind} {m.get('namespace', '')}/{m.get('name')} status",
            "PATCH",
            RESOURCES[kind].path(m.get("namespace"), m.get("name"), "status"),
            guarded=guarded,
            body=dict(body),
            content_type=_APPLY,
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
        )

    def apply(self, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the fields in `body` under our own field manager (the fields
        we applied before and leave out now are removed)."""
        m = body.get("metadata") or {}
        return self._write(
            f"apply {kind} {m.get('namespace', '')}/{m.get('name')}",
            "PATCH",
            RESOURCES[kind].path(m.get("namespace"), m.get("name")),
            body=dict(body),
            content_type=_APPLY,
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
        )

    def merge_status(
        self, kind: str, name: str, namespace: str | None, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        return self._write(
            f"patch {kind} {namespace or ''}/{name} status",
            "PATCH",
            RESOURCES[kind].path(namespace, name, "status"),
            body={"status": dict(status)},
            content_type=_MERGE,
            query={"fieldManager": FIELD_MANAGER},
        )

    def merge_spec(
        self, kind: str, name: str, namespace: str | None, spec: Mapping[str, Any],
        resource_version: str,
    ) -> dict[str, Any]:
        """JSON merge patch of `spec` fields, refused (409) unless the object is still at
        `resource_version`: what was read to compute it is what it replaces."""
        return self._write(
            f"patch {kind} {namespace or ''}/{name}",
            "PATCH",
            RESOURCES[kind].path(namespace, name),
            body={"metadata": {"resourceVersion": resource_version}, "spec": dict(spec)},
            content_type=_MERGE,
            query={"fieldManager": FIELD_MANAGER},
        )

    def patch_pod(self, name: str, namespace: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Strategic-merge patch of a pod (merge keys let us drop one scheduling gate)."""
        return self._write(
            f"patch Pod {namespace}/{name}",
            "PATCH",
            RESOURCES["Pod"].path(namespace, name),
            body=dict(patch),
            content_type=_STRATEGIC,
            query={"fieldManager": FIELD_MANAGER},
        )

    # ---- the leader Lease: neither guarded nor dry-run (it is what decides the guard) ----
    def get_lease(self, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            return self.request(
                "GET", RESOURCES["Lease"].path(namespace, name), timeout=LEASE_TIMEOUT_SECONDS
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def write_lease(self, body: Mapping[str, Any], *, create: bool) -> dict[str, Any]:
        """Create, or replace with the resourceVersion in `body` (409 when it is stale)."""
        m = body.get("metadata") or {}
        res = RESOURCES["Lease"]
        return self.request(
            "POST" if create else "PUT",
            res.path(m.get("namespace")) if create else res.path(m.get("namespace"), m.get("name")),
            body=dict(body),
            timeout=LEASE_TIMEOUT_SECONDS,
        )
