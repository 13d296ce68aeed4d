"""A stand-in for cluster-autoscaler's ProvisioningRequest API on the e2e plane.

cluster-autoscaler cannot be built here (the module proxy refuses its module), so, the way
KWOK plays the kubelets, this thread plays only what Kueue's provisioning admission check
reads of it: the conditions of each ProvisioningRequest and, for a scale-up, the nodes.

- `check-capacity.autoscaling.x-k8s.io`: Provisioned=True when the request's pods fit
  the fleet as it is (GPUs free on schedulable nodes matching the pod template's
  nodeSelector, after the pods bound there), else Provisioned=False (CapacityIsNotFound),
  asked again on every poll.
- `best-effort-atomic-scale-up.autoscaling.x-k8s.io`: Accepted at once; after
  `scale_up_delay` seconds Provisioned=True with `details` as its `provisioningClassDetails`
  (what Kueue's podSetUpdates.nodeSelector may read), and `join_delay` seconds later the
  nodes for every pod of the request join at once (KWOK nodes from `node_template`): the
  real one also says Provisioned when the scale-up starts, before the nodes are Ready.

What the real cluster-autoscaler adds is in e2e/README.md. A test starts it with
`with Provisioner(...).running() as p:`; `p.created` are the nodes it made, `p.vanished`
the requests deleted before they were Provisioned (a test asserts there are none).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

GROUP, VERSION, PLURAL = "autoscaling.x-k8s.io", "v1", "provisioningrequests"
CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
ATOMIC_SCALE_UP = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
GPU = "nvidia.com/gpu"

# name of a new node -> the objects that make it (the Node, its NodeResourceTopology, ...)
NodeTemplate = Callable[[str], list[dict[str, Any]]]


class Provisioner:
    def __init__(
        self,
        api: client.ApiClient,
        *,
        node_template: NodeTemplate | None = None,
        scale_up_delay: float = 0.0,
        join_delay: float = 0.0,
        details: dict[str, str] | None = None,
        poll_seconds: float = 0.5,
    ) -> None:
        self.api, self.node_template = api, node_template
        self.scale_up_delay, self.details = scale_up_delay, dict(details or {})
        self.join_delay = join_delay
        self._joining: list[threading.Timer] = []
        self.poll_seconds = poll_seconds
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.created: list[str] = []
        self.created_objects: list[dict[str, Any]] = []
        self.vanished: list[str] = []
        self._first_seen: dict[str, float] = {}  # "ns/name" -> monotonic time
        self._provisioned: set[str] = set()
        self._stop = threading.Event()

    @contextlib.contextmanager
    def running(self) -> Iterator[Provisioner]:
        thread = threading.Thread(target=self._loop, name="e2e-provisioner", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(timeout=10)
            for joining in self._joining:  # every node it made is in `created` for cleanup
                joining.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except client.ApiException:
                pass  # the next poll tries again
            except Exception:  # told, and tried again: a test then fails on what it waits for
                traceback.print_exc()
            self._stop.wait(self.poll_seconds)

    def poll(self) -> None:
        """Answer every ProvisioningRequest not Provisioned yet; note those that vanished."""
        items = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
        keys = {f"{r['metadata']['namespace']}/{r['metadata']['name']}": r for r in items}
        for key in self._first_seen:
            if key not in keys and key not in self._provisioned and key not in self.vanished:
                self.vanished.append(key)
        for key, request in keys.items():
            self._first_seen.setdefault(key, time.monotonic())
            if key not in self._provisioned and not _provisioned(request):
                self._answer(key, request)

    def _answer(self, key: str, request: dict[str, Any]) -> None:
        cls = request["spec"].get("provisioningClassName")
        if cls == CHECK_CAPACITY:
            if not _fits(self._pods(request), self._free_gpus()):
                self._set(request, "False", "CapacityIsNotFound", "no room for the pods now")
                return
            self._set(request, "True", "Provisioned", "capacity is available")
        elif cls == ATOMIC_SCALE_UP and self.node_template is not None:
            waited = time.monotonic() - self._first_seen[key]
            if waited < self.scale_up_delay:
                self._set(request, "False", "Provisioning",
                          f"scaling up, ETA {math.ceil(self.scale_up_delay - waited)}s")
                return
            pods = self._pods(request)
            # as cluster-autoscaler does: Provisioned once the scale-up is under way; the
            # nodes join `join_delay` seconds later (cloud instances booting)
            self._set(request, "True", "Provisioned", "scale-up started", details=self.details)
            joining = threading.Timer(self.join_delay, self._scale_up, (request, pods))
            self._joining.append(joining)
            joining.start()
        else:
            return  # a class it does not play: left unanswered, as by an autoscaler without it
        self._provisioned.add(key)

    def _pods(self, request: dict[str, Any]) -> list[tuple[int, dict[str, str]]]:
        """(GPUs, nodeSelector) of every pod the request asks for."""
        ns = request["metadata"]["namespace"]
        out: list[tuple[int, dict[str, str]]] = []
        for ps in request["spec"].get("podSets") or []:
            template = self.api.sanitize_for_serialization(
                self.core.read_namespaced_pod_template(ps["podTemplateRef"]["name"], ns))
            spec = template["template"]["spec"]
            gpus = sum(int((c.get("resources") or {}).get("requests", {}).get(GPU, 0))
                       for c in spec.get("containers") or [])
            out += [(gpus, dict(spec.get("nodeSelector") or {}))] * int(ps["count"])
        return out

    def _free_gpus(self) -> list[tuple[dict[str, str], int]]:
        """(labels, free GPUs) of every schedulable node, after its bound pods."""
        used: dict[str, int] = {}
        for pod in self.core.list_pod_for_all_namespaces().items:
            if pod.spec.node_name and pod.status.phase not in ("Succeeded", "Failed"):
                used[pod.spec.node_name] = used.get(pod.spec.node_name, 0) + sum(
                    int((c.resources.requests or {}).get(GPU, 0)) for c in pod.spec.containers)
        return [
            (dict(n.metadata.labels or {}),
             int((n.status.allocatable or {}).get(GPU, 0)) - used.get(n.metadata.name, 0))
            for n in self.core.list_node().items if not n.spec.unschedulable
        ]

    def _scale_up(self, request: dict[str, Any], pods: list[tuple[int, dict[str, str]]]) -> None:
        """Nodes for every pod at once (atomic): as many as the pods need, packed."""
        assert self.node_template is not None
        per_node = _gpus_of(self.node_template("probe"))
        needed = math.ceil(sum(g for g, _ in pods) / per_node) if per_node else len(pods)
        stem = hashlib.sha256(request["metadata"]["uid"].encode()).hexdigest()[:6]
        for i in range(max(needed, 1)):
            name = f"prov-{stem}-{i}"
            for obj in self.node_template(name):
                self._create(obj)
            if name not in self.created:
                self.created.append(name)

    def _create(self, obj: dict[str, Any]) -> None:
        try:
            if obj["kind"] == "Node":
                self.core.create_node(obj)
            else:
                group, version = obj["apiVersion"].split("/")
                self.custom.create_cluster_custom_object(group, version, plural_of(obj), obj)
        except client.ApiException as e:
            if e.status != 409:  # AlreadyExists: made by an earlier poll
                raise
        if obj not in self.created_objects:
            self.created_objects.append(obj)

    def _read(self, request: dict[str, Any]) -> dict[str, Any]:
        m = request["metadata"]
        return self.custom.get_namespaced_custom_object(
            GROUP, VERSION, m["namespace"], PLURAL, m["name"])

    def _set(
        self, request: dict[str, Any], status: str, reason: str, message: str, *,
        details: dict[str, str] | None = None,
    ) -> None:
        """Write the Accepted and Provisioned conditions through the status subresource, as
        the real one does; not again while Provisioned keeps its status and reason."""
        before = {c["type"]: c for c in (request.get("status") or {}).get("conditions") or []}
        old = before.get("Provisioned")
        if old is not None and (old["status"], old["reason"]) == (status, reason):
            return
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        generation = request["metadata"].get("generation", 1)
        body: dict[str, Any] = {"conditions": [
            {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "accepted",
             "lastTransitionTime": before.get("Accepted", {}).get("lastTransitionTime", now),
             "observedGeneration": generation},
            {"type": "Provisioned", "status": status, "reason": reason, "message": message,
             "lastTransitionTime": now, "observedGeneration": generation},
        ]}
        if details:
            body["provisioningClassDetails"] = details
        m = request["metadata"]
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, m["namespace"], PLURAL, m["name"], {"status": body})


def plural_of(obj: dict[str, Any]) -> str:
    """The resource name of a cluster-scoped custom object's kind (NodeResourceTopology)."""
    kind = obj["kind"].lower()
    return kind[:-1] + "ies" if kind.endswith("y") else kind + "s"


def _provisioned(request: dict[str, Any]) -> bool:
    return any(c.get("type") == "Provisioned" and c.get("status") == "True"
               for c in (request.get("status") or {}).get("conditions") or [])


def _gpus_of(objects: list[dict[str, Any]]) -> int:
    node = next(o for o in objects if o["kind"] == "Node")
    return int(node["status"]["allocatable"].get(GPU, 0))


def _fits(pods: list[tuple[int, dict[str, str]]], nodes: list[tuple[dict[str, str], int]]) -> bool:
    """First fit, the largest pods first, on the free GPUs of matching nodes."""
    free = [gpus for _, gpus in nodes]
    for gpus, selector in sorted(pods, key=lambda p: -p[0]):
        fit = next((i for i, (labels, _) in enumerate(nodes) if free[i] >= gpus
                    and all(labels.get(k) == v for k, v in selector.items())), None)
        if fit is None:
            return False
        free[fit] -= gpus
    return True
