"""The candidates' room: the shortcut a one-pod decision takes against pod_capacity."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_admit.model import GPU_WHOLE, Node, NumaPolicy, PodSet, pod_capacity
from nexus_admit.placement.reduction import room_for_one
from tests.strategies import nodes, pod_sets

_near = st.integers(-2, 2)  # a node's free amount minus the pod's need, in units of 1,000


@settings(max_examples=400)
@given(
    node=nodes("n"),
    ps=pod_sets("ps"),
    policy=st.sampled_from(list(NumaPolicy)),
    free_pods=st.integers(-1, 2),
    cpu=_near,
    memory=_near,
    busy=st.lists(st.sampled_from((0, 250, 500, GPU_WHOLE)), max_size=8),
)
def test_room_for_one_pod_is_pod_capacity_capped_at_one(
    node: Node, ps: PodSet, policy: NumaPolicy, free_pods: int, cpu: int, memory: int,
    busy: list[int],
) -> None:
    node.free_pods = free_pods
    node.free_cpu_milli = ps.cpu_milli + 1000 * cpu  # on either side of the pod's need
    node.free_memory_mib = ps.memory_mib + 1000 * memory
    node.gpu_free = [*busy, *node.gpu_free][: len(node.gpu_free)]
    assert room_for_one(node, ps, policy) == min(pod_capacity(node, ps, policy), 1)
