"""Node views: an emptied node is the node's capacity, the original stays as it is."""

from __future__ import annotations

from nexus_admit.model import GPU_WHOLE
from tests.factories import gpu_node


def test_emptied_node_has_everything_free_and_leaves_the_original_alone() -> None:
    busy = gpu_node("n0", used=range(5))
    busy.free_cpu_milli, busy.free_memory_mib, busy.free_pods = 1000, 2048, 3
    for zone in busy.numa_zones:
        zone.free_cpu_milli = 0
    idle = busy.emptied()
    assert idle.gpu_free == [GPU_WHOLE] * busy.gpu_count
    assert (idle.free_cpu_milli, idle.free_memory_mib, idle.free_pods) == (
        busy.cpu_milli, busy.memory_mib, busy.max_pods)
    assert [z.free_cpu_milli for z in idle.numa_zones] == [z.cpu_milli for z in busy.numa_zones]
    assert idle.is_pristine() and not busy.is_pristine()
    assert busy.free_cpu_milli == 1000 and all(z.free_cpu_milli == 0 for z in busy.numa_zones)
    assert (idle.name, idle.labels, idle.clique) == (busy.name, busy.labels, busy.clique)
