"""The change cursor every cache kept from a TrackedSnapshot's log reads it through."""

from __future__ import annotations

from nexus_admit.model import GPU_WHOLE, ClusterSnapshot, Node
from nexus_admit.placement.tracking import ChangeCursor, TrackedSnapshot, too_many_changes


def _fleet(n: int) -> TrackedSnapshot:
    return TrackedSnapshot.of(
        Node(name=f"n{i}", labels={}, taints=(), cpu_milli=64_000, memory_mib=262_144,
             max_pods=16, gpu_product="NVIDIA-H100-80GB-HBM3", gpu_memory_mib=81559,
             gpu_free=[GPU_WHOLE] * 8, free_cpu_milli=64_000, free_memory_mib=262_144,
             free_pods=16)
        for i in range(n)
    )


def test_a_cursor_gives_what_changed_since_its_last_call_once() -> None:
    snapshot = _fleet(8)
    cursor = ChangeCursor(snapshot)
    assert cursor.changed(snapshot) == set()
    snapshot.touch(["n1", "n2", "n1", "gone"])  # a name the snapshot lacks is left out
    assert cursor.changed(snapshot) == {"n1", "n2"}
    assert cursor.changed(snapshot) == set()


def test_another_snapshot_or_too_many_changes_mean_a_rebuild() -> None:
    snapshot = _fleet(8)
    cursor = ChangeCursor(snapshot)
    other = _fleet(8)
    assert cursor.follows(snapshot) and not cursor.follows(other)
    assert not cursor.follows(ClusterSnapshot(dict(snapshot.nodes)))
    assert cursor.changed(other) is None
    snapshot.touch(["n0"] * 67)  # past 64 + 8 // 4
    assert too_many_changes(67, 8) and not too_many_changes(67, 8 * 4)
    assert cursor.changed(snapshot) is None
    assert cursor.seen == 0, "unmoved: the cache rebuilds with a cursor of its own"
