"""What the engine reads of every candidate node on every solve (free-capacity views and how
many pods of a shape fit), kept between solves on a `TrackedSnapshot`.

The controller's passes (`kube/cluster/live.py`) and the simulator keep one snapshot from
decision to decision, and each decision changes a handful of nodes, yet the engine looks
at every node to find interchangeable ones; recomputing those views was a large share of
each solve on the 1,213-node openb fleet. On a `TrackedSnapshot` the memo drops exactly
the nodes its change log names (`tracking.ChangeCursor`; all of them past its rebuild
rule). On any other snapshot it remembers nothing: nothing says what changed between
solves. An entry also remembers the node object it was computed from, so a node replaced
under the same name is never answered from the old one.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from operator import attrgetter

from nexus_admit.model import (
    GPU_WHOLE,
    ClusterSnapshot,
    Node,
    NumaPolicy,
    PlacementConfig,
    PodSet,
    pod_capacity,
)
from nexus_admit.placement.tracking import ChangeCursor, TrackedSnapshot

__all__ = ["NodeMemo", "NodeView", "node_state", "pod_shape"]

# what pod_capacity reads of a pod set (and the NUMA policy it is asked under)
_Shape = tuple[int, int, int, int, NumaPolicy]


def pod_shape(pod_set: PodSet) -> tuple[int, int, int, int]:
    """What `pod_capacity` reads of a pod set: CPU, memory, GPU count, share per GPU."""
    return (pod_set.cpu_milli, pod_set.memory_mib, pod_set.gpus, pod_set.gpu_milli)


_ZONE_STATE = attrgetter("gpu_indices", "free_cpu_milli")


def node_state(node: Node) -> tuple[object, ...]:
    """Everything `pod_capacity` and the symmetry reduction's keys (reduction.py) read of
    a node besides its name and labels: nodes of equal state answer them alike."""
    return (node.free_pods, node.free_cpu_milli, node.free_memory_mib, tuple(node.gpu_free),
            tuple(map(_ZONE_STATE, node.numa_zones)), node.gpu_memory_mib, node.gpu_product)


@dataclass(frozen=True, slots=True)
class NodeView:
    """Free-capacity views of one node state."""

    free_whole_gpus: int
    free_gpu_milli: int
    pristine: bool
    sorted_gpu_free: tuple[int, ...]


class NodeMemo:
    def __init__(self) -> None:
        self._cursor: ChangeCursor | None = None  # on the TrackedSnapshot remembered
        self._views: dict[str, tuple[Node, NodeView]] = {}
        self._states: dict[str, tuple[Node, tuple[object, ...]]] = {}
        self._caps: dict[str, tuple[Node, dict[_Shape, int]]] = {}
        # per node, values the caller derives from the node state, the config and a
        # signature of what else it read (see `derived`)
        self._derived: dict[str, tuple[Node, dict[Hashable, tuple[object, ...]]]] = {}
        self._config: PlacementConfig | None = None
        self._active = False  # remembering at all: only on a TrackedSnapshot

    def sync(self, snapshot: ClusterSnapshot, config: PlacementConfig) -> None:
        """Call before reading a snapshot: forget what its changes since the last call made
        stale (a TrackedSnapshot), or everything (any other snapshot); derived values also
        when the config object changes."""
        if config is not self._config:
            self._derived.clear()
            self._config = config
        self._active = isinstance(snapshot, TrackedSnapshot)
        changed = (self._cursor.changed(snapshot) if self._cursor is not None
                   and isinstance(snapshot, TrackedSnapshot) else None)
        if changed is not None:
            for name in changed:
                self._views.pop(name, None)
                self._states.pop(name, None)
                self._caps.pop(name, None)
                self._derived.pop(name, None)
            return
        self._views.clear()
        self._states.clear()
        self._caps.clear()
        self._derived.clear()
        self._cursor = ChangeCursor(snapshot) if isinstance(snapshot, TrackedSnapshot) else None

    @property
    def remembers(self) -> bool:
        """Whether anything is kept between solves (the last `sync` was of a
        TrackedSnapshot)."""
        return self._active

    def view(self, node: Node) -> NodeView:
        entry = self._views.get(node.name)
        if entry is not None and entry[0] is node:
            return entry[1]
        free = node.gpu_free
        view = NodeView(
            free_whole_gpus=sum(1 for g in free if g == GPU_WHOLE),
            free_gpu_milli=sum(free),
            pristine=node.is_pristine(),
            sorted_gpu_free=tuple(sorted(free)),
        )
        if self._active:
            self._views[node.name] = (node, view)
        return view

    def state(self, node: Node) -> tuple[object, ...]:
        """`node_state(node)`, remembered until the node changes."""
        entry = self._states.get(node.name)
        if entry is not None and entry[0] is node:
            return entry[1]
        state = node_state(node)
        if self._active:
            self._states[node.name] = (node, state)
        return state

    def capacity(self, node: Node, pod_set: PodSet, policy: NumaPolicy) -> int:
        """`pod_capacity(node, pod_set, policy)`, remembered per node state and pod shape."""
        return self.capacities([node], pod_set, policy)[0]

    def capacities(self, nodes: Sequence[Node], pod_set: PodSet, policy: NumaPolicy) -> list[int]:
        """`capacity` for many nodes and one pod set (the engine's candidate scan)."""
        if not self._active:
            return [pod_capacity(node, pod_set, policy) for node in nodes]
        shape = (*pod_shape(pod_set), policy)
        out: list[int] = []
        caps = self._caps
        for node in nodes:
            entry = caps.get(node.name)
            if entry is None or entry[0] is not node:
                entry = (node, {})
                caps[node.name] = entry
            cap = entry[1].get(shape)
            if cap is None:
                cap = pod_capacity(node, pod_set, policy)
                entry[1][shape] = cap
            out.append(cap)
        return out

    def derived(
        self, node: Node, signature: Hashable, compute: Callable[[], tuple[object, ...]]
    ) -> tuple[object, ...]:
        """`compute()`, remembered per node state: the caller promises that it reads only
        the node, the config of the last `sync` and what `signature` names."""
        if not self._active:
            return compute()
        entry = self._derived.get(node.name)
        if entry is None or entry[0] is not node:
            entry = (node, {})
            self._derived[node.name] = entry
        value = entry[1].get(signature)
        if value is None:
            value = compute()
            entry[1][signature] = value
        return value
