"""Cluster dumps: what `kubectl get nodes,pods,workloads,... -A -o yaml` prints (a `List`),
or multi-document YAML of the same objects (Lists may nest) → objects by kind →
ClusterSnapshot + pending Gangs in creation order.

Kinds used (others are kept but ignored): Node, Pod, Workload, ClusterQueue, LocalQueue,
ResourceFlavor, Topology, AdmissionCheck, NodeResourceTopology, ResourceSlice, ResourceClaim,
ResourceClaimTemplate, ResourceReservation, PlacementConfig, and workload owners (Job,
JobSet, ...) when present.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from nexus_admit.kube import labels as L
from nexus_admit.kube.cluster import build_snapshot, topologies_from_objects
from nexus_admit.kube.dra import (
    DraIndex,
    closed_cliques,
    domain_cliques,
    merge_held,
    pod_domain_cliques,
)
from nexus_admit.kube.errors import (
    Obj,
    Skipped,
    TranslationError,
    mapping,
    meta,
    object_key,
    object_ref,
)
from nexus_admit.kube.kueue import (
    KueueIndex,
    admission_order_key,
    creation_key,
    is_pending_on_check,
)
from nexus_admit.kube.podspec import workload_template_requests
from nexus_admit.kube.serving import ServiceIndex, service_key, serving_gang
from nexus_admit.kube.translate import placement_config_from_object
from nexus_admit.kube.workload import OWNER_KINDS, workload_to_gang
from nexus_admit.model import ClusterSnapshot, Gang, PlacementConfig

__all__ = ["ClusterDump", "DumpError", "OwnerLookup", "flatten", "load_dump", "load_objects"]


class DumpError(ValueError):
    """The file is not YAML of Kubernetes objects."""


def flatten(docs: Iterable[Any], source: str = "<input>") -> Iterator[dict[str, Any]]:
    """Objects of `docs`, with every `List` (kind List or *List with items) unrolled."""
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise DumpError(f"{source}: document {i + 1} is not a Kubernetes object")
        kind = str(doc.get("kind") or "")
        if "items" in doc and (kind == "List" or kind.endswith("List") or not kind):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise DumpError(f"{source}: document {i + 1}: items must be a list")
            item_kind = kind[:-4] if kind.endswith("List") and kind != "List" else ""
            yield from flatten(
                (
                    {"kind": item_kind, **it}
                    if isinstance(it, Mapping) and item_kind and "kind" not in it
                    else it
                    for it in items
                ),
                source,
            )
            continue
        if not kind:
            raise DumpError(f"{source}: document {i + 1} has no kind")
        yield dict(doc)


def load_objects(source: str | Path | Sequence[Any]) -> list[dict[str, Any]]:
    """Objects from a file (Path), YAML text (str), or already-parsed documents."""
    if isinstance(source, Path):
        try:
            text = source.read_text()
        except OSError as e:
            raise DumpError(f"{source}: cannot read: {e.strerror or e}") from None
        name = str(source)
    elif isinstance(source, str):
        text, name = source, "<input>"
    else:
        return list(flatten(source))
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        raise DumpError(f"{name}: not valid YAML: {e}") from None
    return list(flatten(docs, name))


# the kinds a Workload's owner is looked up in: a plain-pod Workload's owner is its Pod
# (a Deployment's replica), a replica's ReplicaSet names its Deployment
_OWNER_LOOKUP_KINDS = frozenset({*OWNER_KINDS, "Pod"})


def _owner_key(namespace: str, name: str) -> str:
    # as the controller's store keys its objects
    return f"{namespace}/{name}" if namespace else name


class OwnerLookup(Mapping[tuple[str, str, str], dict[str, Any]]):
    """A dump's owner objects by (kind, namespace, name). A pass reads the owners of a few
    Workloads: this indexes a kind on first use (or reads the controller store's own maps),
    instead of indexing every pod of the cluster on every pass."""

    __slots__ = ("_dump", "_indexed")

    def __init__(self, dump: ClusterDump) -> None:
        self._dump = dump
        self._indexed: dict[str, Mapping[str, dict[str, Any]]] = {}

    def _of(self, kind: str) -> Mapping[str, dict[str, Any]]:
        if kind not in _OWNER_LOOKUP_KINDS:
            return {}
        keyed = self._dump.keyed
        if keyed is not None:
            return keyed.get(kind) or {}
        index = self._indexed.get(kind)
        if index is None:
            index = self._indexed[kind] = {
                _owner_key(str(meta(o).get("namespace") or ""), str(meta(o).get("name") or "")): o
                for o in self._dump.kind(kind)
            }
        return index

    def __getitem__(self, key: tuple[str, str, str]) -> dict[str, Any]:
        kind, namespace, name = key
        found = self._of(kind).get(_owner_key(namespace, name))
        if found is None or found.get("kind", kind) != kind:
            raise KeyError(key)
        return found

    def __iter__(self) -> Iterator[tuple[str, str, str]]:
        for kind in sorted(_OWNER_LOOKUP_KINDS):
            for o in list(self._of(kind).values()):
                yield (kind, str(meta(o).get("namespace") or ""), str(meta(o).get("name") or ""))

    def __len__(self) -> int:
        return sum(len(self._of(kind)) for kind in _OWNER_LOOKUP_KINDS)


@dataclass(slots=True)
class ClusterDump:
    """Objects of a dump grouped by kind."""

    by_kind: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # the controller's store: its objects by kind, then 'namespace/name' (read-only views;
    # a lookup is one dict read, safe from a worker thread while the event loop writes)
    keyed: Mapping[str, Mapping[str, dict[str, Any]]] | None = None
    # which service's Workloads hold slots where (built on the first serving gang)
    _services: ServiceIndex | None = field(default=None, init=False, repr=False, compare=False)
    _dra: DraIndex | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, objects: Iterable[Mapping[str, Any]]) -> ClusterDump:
        dump = cls()
        for o in objects:
            dump.by_kind.setdefault(str(o.get("kind")), []).append(dict(o))
        return dump

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return self.by_kind.get(kind, [])

    # ---- Kueue ----
    def kueue_index(self) -> KueueIndex:
        return KueueIndex.of(
            cluster_queues=self.kind("ClusterQueue"),
            local_queues=self.kind("LocalQueue"),
            resource_flavors=self.kind("ResourceFlavor"),
            admission_checks=self.kind("AdmissionCheck"),
            owners=OwnerLookup(self),
            runtime_classes=self.kind("RuntimeClass"),
            limit_ranges=self.kind("LimitRange"),
        )

    def dra_index(self) -> DraIndex:
        """ResourceClaim(Template)s and the nodes with DRA GPUs, for claim translation."""
        if self._dra is None:
            self._dra = DraIndex.of(
                self.kind("ResourceClaimTemplate"),
                self.kind("ResourceClaim"),
                self.kind("ResourceSlice"),
                self.kind("DeviceTaintRule"),
            )
        return self._dra

    def kueue_topologies(self) -> dict[str, tuple[str, ...]]:
        return topologies_from_objects(self._kueue("Topology"))

    def _kueue(self, kind: str) -> list[dict[str, Any]]:
        return [
            o
            for o in self.kind(kind)
            if str(o.get("apiVersion", L.KUEUE_API_GROUP)).startswith(L.KUEUE_API_GROUP)
        ]

    # ---- config ----
    def placement_config(self, name: str | None = None) -> PlacementConfig:
        """The PlacementConfig our AdmissionCheck names in `spec.parameters`, else the one
        named `default`, else the only one, else the built-in defaults."""
        configs = {str(meta(o).get("name")): o for o in self.kind(L.KIND_PLACEMENT_CONFIG)}
        if name is None:
            for ac in self.kind("AdmissionCheck"):
                spec = mapping(ac, ac.get("spec"), "spec")
                params = mapping(ac, spec.get("parameters"), "spec.parameters")
                if (
                    spec.get("controllerName") == L.ADMISSION_CHECK_CONTROLLER
                    and params.get("kind") == L.KIND_PLACEMENT_CONFIG
                ):
                    name = str(params.get("name"))
                    if name not in configs:
                        raise TranslationError(
                            object_ref(ac),
                            "spec.parameters.name",
                            f"PlacementConfig {name!r} is not in the snapshot",
                        )
                    break
        if name is not None:
            if name not in configs:
                raise TranslationError(f"PlacementConfig {name}", "", "not in the snapshot")
            return placement_config_from_object(configs[name])
        if "default" in configs:
            return placement_config_from_object(configs["default"])
        if len(configs) == 1:
            return placement_config_from_object(next(iter(configs.values())))
        return PlacementConfig()

    # ---- snapshot ----
    def snapshot(
        self,
        *,
        exclude_workloads: Iterable[str] = (),
        now: datetime | None = None,
        skipped: list[Skipped] | None = None,
    ) -> ClusterSnapshot:
        """The cluster's free capacity. `skipped` (the controller's passes): malformed
        objects are left out and listed there instead of raising `TranslationError`
        (`kube.cluster.build_snapshot`)."""
        template_requests: dict[tuple[str, str], tuple[int, int, int]] = {}
        admitted = KueueIndex.of(runtime_classes=self.kind("RuntimeClass"),
                                 limit_ranges=self.kind("LimitRange"))
        for wl in self.kind("Workload"):
            # a malformed Workload is reported when it is translated, not here
            with contextlib.suppress(TranslationError):
                template_requests.update(workload_template_requests(wl, admitted))
        return build_snapshot(
            self.kind("Node"),
            self.kind("Pod"),
            self.kind(L.KIND_RESOURCE_RESERVATION),
            node_resource_topologies=self.kind("NodeResourceTopology"),
            resource_slices=self.kind("ResourceSlice"),
            resource_claims=self.kind("ResourceClaim"),
            topologies=self._kueue("Topology"),
            workloads=self.kind("Workload"),
            exclude_workloads=exclude_workloads,
            template_requests=template_requests,
            admitted=admitted,
            now=now,
            skipped=skipped,
        )

    # ---- workloads ----
    def workloads(self) -> list[dict[str, Any]]:
        """Every Workload, in creation order."""
        return sorted(self.kind("Workload"), key=creation_key)

    def pending_workloads(self, checks: set[str] | None = None) -> list[dict[str, Any]]:
        """Workloads waiting on the nexus check (`checks`: our AdmissionCheck names, default
        every one in the dump), in Kueue's admission order (priority, then creation)."""
        if checks is None:
            checks = self.kueue_index().our_checks()
        pending = [w for w in self.kind("Workload") if is_pending_on_check(w, checks)]
        return sorted(pending, key=admission_order_key)

    def find_workload(self, key: str) -> dict[str, Any] | None:
        """A Workload by 'namespace/name' (or 'name' in namespace default)."""
        key = key if "/" in key else f"default/{key}"
        for w in self.kind("Workload"):
            if object_key(w) == key:
                return w
        return None

    def gang(
        self,
        workload: Obj,
        config: PlacementConfig,
        snapshot: ClusterSnapshot,
        kueue: KueueIndex | None = None,
        now: datetime | None = None,
    ) -> Gang:
        """Translate one Workload against `snapshot` (its nodes and topologies); `now` gives
        the gang its waited time (PlacementConfig.localityWait). A serving Workload gets its
        service, the nodes where the service's other Workloads hold slots (the dump's live
        reservations) and its pod templates' hard spread rules (kube/serving.py)."""
        try:
            levels: tuple[str, ...] = config.resolve_levels(snapshot.kueue_topologies)
        except ValueError as e:
            raise TranslationError(
                "PlacementConfig", "spec.topology.topologyName", str(e)
            ) from None
        kueue = kueue or self.kueue_index()
        gang = workload_to_gang(
            workload,
            config=config,
            kueue=kueue,
            nodes=snapshot.nodes.values(),
            levels=levels,
            now=now,
            dra=self.dra_index(),
        )
        if gang.compute_domain is not None:  # at most one ComputeDomain per NVLink clique
            held = merge_held(
                domain_cliques(self.kind(L.KIND_RESOURCE_RESERVATION), snapshot.nodes),
                pod_domain_cliques(self.kind("Pod"), self.dra_index(), snapshot.nodes),
            )
            gang = replace(gang, closed_cliques=closed_cliques(gang.compute_domain, held))
        if self._services is None and service_key(workload, kueue) is not None:
            self._services = ServiceIndex.of(
                self.kind("Workload"), self.kind(L.KIND_RESOURCE_RESERVATION), kueue, now
            )
        return serving_gang(gang, workload, kueue, levels, self._services)


def load_dump(source: str | Path | Sequence[Any]) -> ClusterDump:
    """Load a dump (path, YAML text or parsed documents)."""
    return ClusterDump.of(load_objects(source))
