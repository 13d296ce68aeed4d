"""Baseline policies behind the one `place()` interface: each works on an easy gang, each
behaves like its published definition on a scenario that tells them apart, and the
registry answers clearly for a name it does not know."""

from __future__ import annotations

import pytest

from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    Placement,
    PodSet,
    SolveStatus,
    WorkloadType,
)
from nexus_admit.placement.base import PlacementPolicy
from nexus_admit.placement.policies import make_policy, policy_names
from nexus_admit.placement.validate import violations
from tests.factories import A100, HOST, RACK, T4, config, gpu_node, node_state, snapshot

CONFIG = config()
ENGINES = ("nexus",)  # the CP-SAT engine
BASELINES = [p for p in policy_names() if p not in ENGINES]


def run(policy: str, snap: ClusterSnapshot, gang: Gang, seed: int = 0) -> Placement:
    placement = make_policy(policy, seed=seed).place(snap, gang, CONFIG)
    assert violations(snap, gang, placement, CONFIG) == []
    return placement


def racks_of(snap: ClusterSnapshot, placement: Placement) -> set[str]:
    return {snap.nodes[n].labels[RACK] for n in placement.pods_per_node()}


def test_registry_lists_the_documented_policies() -> None:
    names = policy_names()
    for expected in ("nexus", "default", "binpack", "bestfit", "random", "tas-bestfit"):
        assert expected in names
    assert names == sorted(names)


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_places_a_trivially_feasible_gang(policy: str) -> None:
    snap = snapshot(gpu_node("a", gpu=A100), gpu_node("b", gpu=T4, used=range(4)))
    before = node_state(snap)
    gang = Gang("ns/easy", (PodSet("w", 2, cpu_milli=2000, memory_mib=4096, gpus=1),))
    instance = make_policy(policy, seed=3)
    assert isinstance(instance, PlacementPolicy)
    assert instance.name == policy
    p = run(policy, snap, gang, seed=3)
    assert p.feasible, p.reason
    assert p.policy == policy
    assert p.gang == "ns/easy"
    assert sorted(s.index for s in p.slots) == [0, 1]
    assert p.explanation and "2 pods" in p.explanation[0]
    assert set(p.terms) >= {"tierMismatch", "islandsBroken", "nodesUsed"}
    assert node_state(snap) == before  # place() never mutates its input
    if policy not in ENGINES:
        assert p.status is SolveStatus.HEURISTIC


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_rejects_a_vram_request_no_gpu_can_meet(policy: str) -> None:
    snap = snapshot(gpu_node("a", gpu=A100))
    p = run(policy, snap, Gang("ns/big", (PodSet("w", 1, gpus=1, vram_mib=141 * 1024),)))
    assert not p.feasible
    assert p.status is SolveStatus.IMPOSSIBLE
    assert "141 GiB" in p.reason


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_is_all_or_nothing(policy: str) -> None:
    snap = snapshot(gpu_node("a", used=range(5)), gpu_node("b", used=range(5)))  # 6 free
    p = run(policy, snap, Gang("ns/g", (PodSet("w", 4, gpus=2),)))  # 8 asked
    assert not p.feasible
    assert p.retryable
    assert p.slots == []


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_honours_a_required_rack(policy: str) -> None:
    snap = snapshot(
        gpu_node("r0-a", used=range(6), rack="r0"),
        gpu_node("r1-a", used=range(4), rack="r1"),
        gpu_node("r1-b", used=range(4), rack="r1"),
        gpu_node("r2-a", used=range(6), rack="r2"),
    )
    gang = Gang("ns/g", (PodSet("w", 3, gpus=2),), required_level=RACK)
    p = run(policy, snap, gang)
    assert p.feasible, p.reason
    assert racks_of(snap, p) == {"r1"}


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_honours_a_required_hostname(policy: str) -> None:
    snap = snapshot(
        gpu_node("r0-a", used=range(4), rack="r0"),
        gpu_node("r1-a", used=range(4), rack="r1"),
        gpu_node("r1-b", used=range(4), rack="r1"),
    )
    gang = Gang("ns/g", (PodSet("server", 3, gpus=1),),
                workload_type=WorkloadType.INFERENCE, required_level=HOST)
    p = run(policy, snap, gang)
    assert p.feasible, p.reason
    assert len(p.pods_per_node()) == 1


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_keeps_all_pod_sets_of_a_gang_in_one_required_rack(policy: str) -> None:
    """The required level binds the whole gang, not each pod set on its own: r0 is the
    tightest rack for the driver alone, but only r1 holds driver and workers together."""
    snap = snapshot(
        gpu_node("r0-a", used=range(6), rack="r0"),
        gpu_node("r1-a", used=range(4), rack="r1"),
        gpu_node("r1-b", used=range(4), rack="r1"),
    )
    gang = Gang("ns/g", (PodSet("driver", 1, gpus=2), PodSet("workers", 3, gpus=2)),
                required_level=RACK)
    p = run(policy, snap, gang)
    assert p.feasible, p.reason
    assert racks_of(snap, p) == {"r1"}


# ---------------------------------------------------------------- Kueue TAS BestFit


def _racks_of_capacity_8_5_2() -> ClusterSnapshot:
    """Free 1-GPU slots per rack: r0 8 (4 + 4), r1 5 (2 + 3), r2 2."""
    return snapshot(
        gpu_node("r0-a", used=range(4), rack="r0"),
        gpu_node("r0-b", used=range(4), rack="r0"),
        gpu_node("r1-a", used=range(6), rack="r1"),
        gpu_node("r1-b", used=range(5), rack="r1"),
        gpu_node("r2-a", used=range(6), rack="r2"),
    )


@pytest.mark.parametrize("request_kind", ["required_level", "preferred_level"])
def test_tas_bestfit_picks_the_tightest_rack_that_fits(request_kind: str) -> None:
    snap = _racks_of_capacity_8_5_2()
    gang = Gang("ns/g", (PodSet("w", 4, gpus=1),), **{request_kind: RACK})  # type: ignore[arg-type]
    p = run("tas-bestfit", snap, gang)
    assert racks_of(snap, p) == {"r1"}
    # inside the rack: the largest node first, the rest to the tightest node that fits
    assert p.pods_per_node() == {"r1-b": 3, "r1-a": 1}


def test_tas_bestfit_without_request_takes_the_tightest_single_node() -> None:
    snap = _racks_of_capacity_8_5_2()
    p = run("tas-bestfit", snap, Gang("ns/g", (PodSet("w", 3, gpus=1),)))
    assert p.pods_per_node() == {"r1-b": 3}


def test_tas_bestfit_fails_when_no_rack_holds_a_required_gang() -> None:
    snap = _racks_of_capacity_8_5_2()
    p = run("tas-bestfit", snap, Gang("ns/g", (PodSet("w", 9, gpus=1),), required_level=RACK))
    assert not p.feasible and p.retryable
    assert "no topology domain" in p.reason


# ---------------------------------------------------------------- kube-scheduler scoring


def _four_equal_nodes() -> ClusterSnapshot:
    return snapshot(*(gpu_node(f"n{i}", used=range(4)) for i in range(4)))


def test_default_spreads_least_allocated() -> None:
    gang = Gang("ns/g", (PodSet("w", 4, cpu_milli=8000, memory_mib=8192, gpus=1),))
    p = run("default", _four_equal_nodes(), gang)
    assert p.pods_per_node() == {"n0": 1, "n1": 1, "n2": 1, "n3": 1}


def test_binpack_packs_most_allocated() -> None:
    gang = Gang("ns/g", (PodSet("w", 4, cpu_milli=8000, memory_mib=8192, gpus=1),))
    p = run("binpack", _four_equal_nodes(), gang)
    assert len(p.pods_per_node()) == 1


def test_binpack_prefers_the_fuller_node() -> None:
    snap = snapshot(gpu_node("empty"), gpu_node("half", used=range(4)))
    p = run("binpack", snap, Gang("ns/g", (PodSet("w", 1, gpus=1),)))
    assert p.pods_per_node() == {"half": 1}


def test_default_prefers_the_emptier_node() -> None:
    snap = snapshot(gpu_node("half", used=range(4)), gpu_node("empty"))
    snap.nodes["half"].free_cpu_milli //= 2
    p = run("default", snap, Gang("ns/g", (PodSet("w", 1, cpu_milli=1000, gpus=1),)))
    assert p.pods_per_node() == {"empty": 1}


def test_bestfit_takes_the_tightest_node() -> None:
    snap = snapshot(gpu_node("empty"), gpu_node("six-used", used=range(6)),
                    gpu_node("four-used", used=range(4)))
    p = run("bestfit", snap, Gang("ns/g", (PodSet("w", 1, gpus=2),)))
    assert p.pods_per_node() == {"six-used": 1}


# ---------------------------------------------------------------- random


@pytest.mark.parametrize("policy", [p for p in ("random", "paper-random") if p in policy_names()])
def test_random_is_reproducible_per_seed(policy: str) -> None:
    snap = snapshot(*(gpu_node(f"n{i}", used=range(4)) for i in range(8)))
    gang = Gang("ns/g", (PodSet("w", 3, gpus=1),), workload_type=WorkloadType.BATCH)

    def layout(seed: int) -> list[tuple[str, int, str]]:
        p = run(policy, snap, gang, seed=seed)
        return sorted((s.pod_set, s.index, s.node) for s in p.slots)

    assert layout(7) == layout(7)
    assert layout(11) == layout(11)
    assert len({tuple(layout(seed)) for seed in range(8)}) > 1  # and it is random


# ---------------------------------------------------------------- registry


def test_unknown_policy_name_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown policy 'kube-default'") as err:
        make_policy("kube-default")
    message = str(err.value)
    for name in policy_names():
        assert repr(name) in message
