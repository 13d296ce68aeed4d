"""`fit_pod`, `pod_capacity` and `apply_slots`/`release_slots`: the one definition of "this
pod fits on this node now" that every policy, the validator and the simulator share."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_admit.model import (
    GPU_WHOLE,
    Fit,
    Gang,
    Node,
    NumaPolicy,
    Placement,
    PodSet,
    Slot,
    SolveStatus,
    apply_slots,
    fit_pod,
    pod_capacity,
    release_slots,
)
from tests.factories import gpu_node, node_state, snapshot
from tests.strategies import nodes, pod_sets

STRICT = NumaPolicy.SINGLE_NUMA_NODE
PREFERRED = NumaPolicy.PREFERRED

# ---------------------------------------------------------------- whole GPUs and NUMA


def test_whole_gpus_come_from_the_fullest_zone_that_holds_them() -> None:
    # zone 0 (GPUs 0-3) has 3 free, zone 1 (GPUs 4-7) has 4 free
    node = gpu_node("n", used=[0])
    two = PodSet("w", 1, cpu_milli=1000, gpus=2)
    assert fit_pod(node, two) == Fit((1, 2), 0, True)
    four = PodSet("w", 1, cpu_milli=1000, gpus=4)
    assert fit_pod(node, four) == Fit((4, 5, 6, 7), 1, True)


def test_pod_spanning_zones_under_preferred_is_unaligned() -> None:
    node = gpu_node("n", used=[0, 1, 4, 5])  # 2 free in each zone
    three = PodSet("w", 1, gpus=3)
    fit = fit_pod(node, three, PREFERRED)
    assert fit is not None
    assert fit.numa_zone is None and not fit.numa_aligned
    assert set(fit.gpu_indices) <= {2, 3, 6, 7} and len(fit.gpu_indices) == 3


def test_single_numa_node_refuses_a_pod_spanning_zones() -> None:
    node = gpu_node("n", used=[0, 1, 4, 5])
    assert fit_pod(node, PodSet("w", 1, gpus=3), STRICT) is None
    assert fit_pod(node, PodSet("w", 1, gpus=2), STRICT) == Fit((2, 3), 0, True)


def test_single_numa_node_needs_cpu_in_the_zone_of_the_gpus() -> None:
    node = gpu_node("n", used=[4, 5, 6, 7])  # zone 0 has all the free GPUs ...
    node.numa_zones[0].free_cpu_milli = 2000  # ... but little CPU
    pod = PodSet("w", 1, cpu_milli=8000, gpus=2)
    assert fit_pod(node, pod, STRICT) is None
    relaxed = fit_pod(node, pod, PREFERRED)
    assert relaxed is not None and relaxed.numa_zone is None and not relaxed.numa_aligned


def test_node_without_numa_information_is_never_unaligned() -> None:
    node = gpu_node("n", numa=False, used=[0])
    fit = fit_pod(node, PodSet("w", 1, gpus=2), STRICT)
    assert fit == Fit((1, 2), None, True)


def test_cpu_only_pod_gets_the_zone_with_most_free_cpu() -> None:
    node = gpu_node("n")
    node.numa_zones[0].free_cpu_milli = 10_000
    node.numa_zones[1].free_cpu_milli = 50_000
    assert fit_pod(node, PodSet("c", 1, cpu_milli=4000)) == Fit((), 1, True)
    node.numa_zones[1].free_cpu_milli = 3000
    node.numa_zones[0].free_cpu_milli = 3000
    assert fit_pod(node, PodSet("c", 1, cpu_milli=4000), STRICT) is None
    assert fit_pod(node, PodSet("c", 1, cpu_milli=4000), PREFERRED) == Fit((), None, False)


def test_whole_gpu_pod_skips_shared_gpus() -> None:
    node = gpu_node("n", gpus=2, numa=False, shares={0: 750})
    assert fit_pod(node, PodSet("w", 1, gpus=1)) == Fit((1,), None, True)
    assert fit_pod(node, PodSet("w", 1, gpus=2)) is None


# ---------------------------------------------------------------- fractional GPUs


@pytest.mark.parametrize(("share", "gpu"), [(250, 1), (600, 2), (800, 0), (200, 3), (1000, 0)])
def test_gpu_share_goes_to_the_fullest_gpu_with_room(share: int, gpu: int) -> None:
    node = gpu_node("n", gpus=4, numa=False, shares={0: 1000, 1: 500, 2: 750, 3: 200})
    fit = fit_pod(node, PodSet("s", 1, gpus=1, gpu_milli=share))
    assert fit is not None and fit.gpu_indices == (gpu,)


def test_gpu_share_with_explicit_choice() -> None:
    node = gpu_node("n", gpus=2, numa=False, shares={1: 500})
    share = PodSet("s", 1, gpus=1, gpu_milli=500)
    assert fit_pod(node, share, gpu_choice=0) == Fit((0,), None, True)
    assert fit_pod(node, share, gpu_choice=1) == Fit((1,), None, True)
    assert fit_pod(node, PodSet("s", 1, gpus=1, gpu_milli=600), gpu_choice=1) is None


def test_gpu_share_reports_the_zone_of_its_gpu() -> None:
    node = gpu_node("n", shares={5: 500})
    fit = fit_pod(node, PodSet("s", 1, cpu_milli=1000, gpus=1, gpu_milli=500))
    assert fit == Fit((5,), 1, True)


def test_gpu_share_whose_cpus_do_not_fit_its_gpus_zone_reports_no_zone() -> None:
    """Unaligned is unaligned: the slot must not name a zone that cannot hold its CPUs (the
    engine's model counts the pod as NUMA-unaligned; the term and the ledger must agree)."""
    node = gpu_node("n", cpu_milli=16_000, shares={6: 250})  # zones of 8,000 millicores
    pod = PodSet("s", 1, cpu_milli=9000, gpus=1, gpu_milli=250)
    assert fit_pod(node, pod) == Fit((6,), None, False)
    assert fit_pod(node, pod, NumaPolicy.SINGLE_NUMA_NODE) is None


def test_gpu_share_prefers_a_gpu_whose_zone_has_its_cpus_over_the_fullest_gpu() -> None:
    """Found by hypothesis: the fullest GPU sat in a zone whose CPUs another pod had taken,
    so the share went unaligned although a GPU in the other zone had room and CPUs."""
    node = gpu_node("n", cpu_milli=16_000, shares={7: 500})
    node.numa_zones[1].free_cpu_milli = 0  # zone 1 (GPUs 4-7) has no CPU left
    pod = PodSet("s", 1, cpu_milli=1000, gpus=1, gpu_milli=250)
    assert fit_pod(node, pod) == Fit((0,), 0, True)
    node.numa_zones[0].free_cpu_milli = 0  # neither zone: the fullest GPU, unaligned
    assert fit_pod(node, pod) == Fit((7,), None, False)
    assert fit_pod(node, pod, NumaPolicy.SINGLE_NUMA_NODE) is None


# ---------------------------------------------------------------- CPU, memory, pod slots


@pytest.mark.parametrize("attr", ["free_cpu_milli", "free_memory_mib", "free_pods"])
def test_fit_pod_respects_cpu_memory_and_pod_slots(attr: str) -> None:
    node = gpu_node("n")
    pod = PodSet("w", 1, cpu_milli=4000, memory_mib=4096, gpus=1)
    assert fit_pod(node, pod) is not None
    setattr(node, attr, {"free_cpu_milli": 3999, "free_memory_mib": 4095, "free_pods": 0}[attr])
    assert fit_pod(node, pod) is None


def test_no_fit_without_enough_free_whole_gpus() -> None:
    node = gpu_node("n", used=range(6))
    assert fit_pod(node, PodSet("w", 1, gpus=2)) is not None
    assert fit_pod(node, PodSet("w", 1, gpus=3)) is None


# ---------------------------------------------------------------- pod_capacity


def test_pod_capacity_is_the_tightest_resource() -> None:
    node = gpu_node("n")  # 8 GPUs, 128 CPUs, 1 TiB
    pod = PodSet("w", 1, cpu_milli=8000, memory_mib=65536, gpus=2)
    assert pod_capacity(node, pod) == 4  # GPUs
    node.free_cpu_milli = 24_000
    assert pod_capacity(node, pod) == 3  # CPU
    node.free_memory_mib = 2 * 65536
    assert pod_capacity(node, pod) == 2  # memory
    node.free_pods = 1
    assert pod_capacity(node, pod) == 1  # pod slots
    node.free_pods = 0
    assert pod_capacity(node, pod) == 0


def test_pod_capacity_for_cpu_only_pods() -> None:
    node = gpu_node("n", cpu_milli=16_000)
    assert pod_capacity(node, PodSet("c", 1, cpu_milli=3000)) == 5
    # under single-numa-node each pod's CPU comes from one zone of 8 CPUs: 2 + 2
    assert pod_capacity(node, PodSet("c", 1, cpu_milli=3000), STRICT) == 4


def test_pod_capacity_for_gpu_shares() -> None:
    node = gpu_node("n", gpus=3, numa=False, shares={0: 1000, 1: 500, 2: 250})
    assert pod_capacity(node, PodSet("s", 1, gpus=1, gpu_milli=500)) == 3
    assert pod_capacity(node, PodSet("s", 1, gpus=1, gpu_milli=250)) == 7


def test_pod_capacity_single_numa_counts_per_zone() -> None:
    node = gpu_node("n", used=[0, 4])  # 3 free GPUs per zone
    pod = PodSet("w", 1, gpus=2)
    assert pod_capacity(node, pod, PREFERRED) == 3
    assert pod_capacity(node, pod, STRICT) == 2


@pytest.mark.parametrize(
    "pod_set",
    [
        PodSet("w", 1, cpu_milli=7000, memory_mib=1024, gpus=1),
        PodSet("w", 1, cpu_milli=7000, gpus=2),
        PodSet("s", 1, cpu_milli=5000, gpus=1, gpu_milli=250),
        PodSet("c", 1, cpu_milli=9000),
    ],
)
@pytest.mark.parametrize("policy", [PREFERRED, STRICT])
def test_pod_capacity_matches_repeated_fit_pod(pod_set: PodSet, policy: NumaPolicy) -> None:
    """For a single pod set the capacity is exact: that many pods fit one after another."""
    snap = snapshot(gpu_node("n", used=[0, 5], shares={1: 500, 6: 750}, cpu_milli=64_000))
    node = snap.nodes["n"]
    cap = pod_capacity(node, pod_set, policy)
    gang = Gang("ns/g", (pod_set,))
    placed = 0
    while (fit := fit_pod(node, pod_set, policy)) is not None:
        apply_slots(snap, gang, [Slot(pod_set.name, placed, "n", fit.gpu_indices, fit.numa_zone)])
        placed += 1
    assert placed == cap


# ---------------------------------------------------------------- apply / release


def test_apply_takes_capacity_and_release_restores_it() -> None:
    snap = snapshot(gpu_node("a", shares={3: 500}), gpu_node("b"))
    before = node_state(snap)
    whole = PodSet("w", 2, cpu_milli=8000, memory_mib=4096, gpus=2)
    share = PodSet("s", 1, cpu_milli=1000, memory_mib=512, gpus=1, gpu_milli=500)
    gang = Gang("ns/g", (whole, share))
    slots = [
        Slot("w", 0, "a", (0, 1), 0),
        Slot("w", 1, "b", (4, 5), 1),
        Slot("s", 0, "a", (3,), 0),
    ]
    apply_slots(snap, gang, slots)
    a, b = snap.nodes["a"], snap.nodes["b"]
    assert a.gpu_free == [0, 0, 1000, 0, 1000, 1000, 1000, 1000]
    assert b.gpu_free == [1000] * 4 + [0, 0] + [1000] * 2
    assert a.free_cpu_milli == 128_000 - 9000
    assert a.free_memory_mib == 1_048_576 - 4608
    assert a.free_pods == 108
    assert [z.free_cpu_milli for z in a.numa_zones] == [64_000 - 9000, 64_000]
    assert [z.free_cpu_milli for z in b.numa_zones] == [64_000, 64_000 - 8000]
    assert not a.is_pristine() and a.used_gpu_milli == 3000
    release_slots(snap, gang, slots)
    assert node_state(snap) == before


def test_slot_without_numa_zone_leaves_zone_cpu_alone() -> None:
    snap = snapshot(gpu_node("a"))
    gang = Gang("ns/g", (PodSet("w", 1, cpu_milli=8000, gpus=6),))
    apply_slots(snap, gang, [Slot("w", 0, "a", (0, 1, 2, 3, 4, 5), None)])
    node = snap.nodes["a"]
    assert node.free_cpu_milli == 120_000
    assert [z.free_cpu_milli for z in node.numa_zones] == [64_000, 64_000]
    assert node.free_whole_gpus == 2


# ---------------------------------------------------------------- Placement views


def test_placement_views() -> None:
    slots = [
        Slot("w", 0, "a", (0, 1), 0),
        Slot("w", 1, "a", (2, 3), 0),
        Slot("w", 2, "b", (4, 5), 1),
        Slot("s", 0, "a", (6,), 1),
        Slot("s", 1, "a", (6,), 1),
    ]
    p = Placement("ns/g", "nexus", True, SolveStatus.OPTIMAL, slots)
    assert p.pods_per_node() == {"a": 4, "b": 1}
    got = {(x.pod_set, x.node): (x.pods, x.gpus, x.numa_zones) for x in p.assignments()}
    assert got == {
        ("w", "a"): (2, 4, (0,)),
        ("w", "b"): (1, 2, (1,)),
        ("s", "a"): (2, 1, (1,)),  # two pods sharing one GPU count one device
    }
    assert not p.retryable


def test_retryable_distinguishes_infeasible_from_impossible() -> None:
    assert Placement("g", "nexus", False, SolveStatus.INFEASIBLE).retryable
    assert not Placement("g", "nexus", False, SolveStatus.IMPOSSIBLE).retryable
    assert GPU_WHOLE == 1000


# ---------------------------------------------------------------- properties

PROPERTY = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(node=nodes("n"), pod_set=pod_sets("p"), policy=st.sampled_from(list(NumaPolicy)))
def test_pod_capacity_is_exact_for_one_pod_set(
    node: Node, pod_set: PodSet, policy: NumaPolicy
) -> None:
    snap = snapshot(node)
    gang = Gang("ns/g", (pod_set,))
    cap = pod_capacity(node, pod_set, policy)
    placed = 0
    while placed <= cap and (fit := fit_pod(node, pod_set, policy)) is not None:
        apply_slots(snap, gang, [Slot(pod_set.name, placed, "n", fit.gpu_indices, fit.numa_zone)])
        placed += 1
    assert placed == cap


@PROPERTY
@given(node=nodes("n"), pod_set=pod_sets("p", max_count=6),
       policy=st.sampled_from(list(NumaPolicy)))
def test_apply_then_release_restores_the_node(
    node: Node, pod_set: PodSet, policy: NumaPolicy
) -> None:
    snap = snapshot(node)
    before = node_state(snap)
    gang = Gang("ns/g", (pod_set,))
    slots = []
    for index in range(pod_set.count):
        fit = fit_pod(node, pod_set, policy)
        if fit is None:
            break
        slot = Slot(pod_set.name, index, "n", fit.gpu_indices, fit.numa_zone)
        apply_slots(snap, gang, [slot])
        slots.append(slot)
    assert all(0 <= g <= GPU_WHOLE for g in node.gpu_free)
    assert node.free_cpu_milli >= 0 and node.free_memory_mib >= 0 and node.free_pods >= 0
    release_slots(snap, gang, slots)
    assert node_state(snap) == before
