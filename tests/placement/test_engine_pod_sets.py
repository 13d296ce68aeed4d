"""Gangs of several pod sets that differ (a JobSet driver without GPUs beside its workers, a
LeaderWorkerSet leader and workers, pod sets with levels of their own): where each pod set
goes, what binds it, and what the explanation says about it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_admit.bench.fleet import RACK as BENCH_RACK
from nexus_admit.bench.fleet import bench_config, generate_fleet
from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    Node,
    Placement,
    PlacementConfig,
    PodSet,
    SolveStatus,
    WorkloadType,
)
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.validate import violations
from tests.factories import HOST, RACK, config, gpu_node, snapshot

CONFIG = config()


def place(snap: ClusterSnapshot, gang: Gang, cfg: PlacementConfig = CONFIG) -> Placement:
    placement = CpSatEngine(seed=0).place(snap, gang, cfg)
    assert violations(snap, gang, placement, cfg) == []
    assert placement.feasible, placement.reason
    assert len(placement.slots) == gang.pod_count
    return placement


def nodes_of(placement: Placement, pod_set: str) -> set[str]:
    return {s.node for s in placement.slots if s.pod_set == pod_set}


def racks_of(snap: ClusterSnapshot, placement: Placement, pod_set: str) -> set[str]:
    return {snap.nodes[n].labels[RACK] for n in nodes_of(placement, pod_set)}


def cpu_node(name: str, rack: str = "r9", *, racked: bool = True, cpu_milli: int = 32_000) -> Node:
    node = gpu_node(name, gpus=0, rack=rack, cpu_milli=cpu_milli, numa=False)
    return node if racked else replace(node, labels={HOST: name})


DRIVER = PodSet("driver", 1, cpu_milli=2000, memory_mib=4096)
WORKERS = PodSet(
    "workers", 4, cpu_milli=32_000, memory_mib=65_536, gpus=8, indexed=True, required_level=RACK
)


def jobset(driver: PodSet = DRIVER, workers: PodSet = WORKERS) -> Gang:
    """A JobSet-like gang: a CPU-only driver and 2 Jobs × 2 pods × 8 GPUs asking for one rack
    (the gang-wide level is the workers', as the translation derives it)."""
    return Gang(
        "ns/js", (driver, workers), tier="gold",
        workload_type=WorkloadType.TRAINING, required_level=RACK,
    )


def gpu_racks(*nodes: Node) -> ClusterSnapshot:
    """r0 has 2 idle 8-GPU nodes (too few for the workers), r1 has 4; plus `nodes`."""
    gpu = [gpu_node(f"r0-{i}", rack="r0") for i in range(2)]
    gpu += [gpu_node(f"r1-{i}", rack="r1") for i in range(4)]
    return snapshot(*gpu, *nodes)


# ---------------------------------------------------------------- a driver without GPUs


def test_jobset_workers_share_one_rack_and_the_driver_takes_a_cpu_node() -> None:
    """The CPU node is in another rack: the driver goes there rather than onto a GPU node of
    the workers' rack (before, the gang-wide rack bound the driver too)."""
    snap = gpu_racks(cpu_node("cpu-0", rack="r9"))
    p = place(snap, jobset())
    assert p.status is SolveStatus.OPTIMAL
    assert racks_of(snap, p, "workers") == {"r1"}
    assert nodes_of(p, "driver") == {"cpu-0"}
    assert "driver: 1 pod on a CPU node; workers: 4 pods in rack r1" in p.explanation
    assert "pod sets workers inside one example.com/rack domain (required)" in p.explanation
    assert "pod set driver: no GPUs, kept to 1 CPU nodes" in p.explanation


def test_driver_on_a_cpu_node_without_topology_labels() -> None:
    snap = gpu_racks(cpu_node("cpu-0", racked=False))
    p = place(snap, jobset())
    assert nodes_of(p, "driver") == {"cpu-0"}
    assert racks_of(snap, p, "workers") == {"r1"}


def test_without_a_cpu_node_the_driver_joins_a_node_the_workers_use() -> None:
    """No node without GPUs: the driver may go anywhere, and takes no fresh GPU node (an idle
    r0 node stays whole)."""
    snap = gpu_racks()
    p = place(snap, jobset())
    assert racks_of(snap, p, "workers") == {"r1"}
    assert nodes_of(p, "driver") <= nodes_of(p, "workers")


def test_a_cpu_node_too_small_for_the_driver_is_passed_over() -> None:
    snap = gpu_racks(cpu_node("cpu-0", cpu_milli=1000))
    p = place(snap, jobset())
    assert nodes_of(p, "driver") != {"cpu-0"}
    assert racks_of(snap, p, "workers") == {"r1"}


def test_a_driver_stating_the_rack_is_bound_to_the_workers_rack() -> None:
    snap = gpu_racks(cpu_node("cpu-0", rack="r9"))
    p = place(snap, jobset(driver=replace(DRIVER, required_level=RACK)))
    assert racks_of(snap, p, "driver") == racks_of(snap, p, "workers") == {"r1"}
    assert "all pods inside one example.com/rack domain (required)" in p.explanation


def test_a_driver_grouped_with_the_workers_is_bound_like_them() -> None:
    """Kueue's podset-group-name: the GPU-less member of a group with GPU pod sets shares
    their domain; a CPU node in the same rack is still its to take."""
    snap = gpu_racks(cpu_node("cpu-9", rack="r9"), cpu_node("cpu-1", rack="r1"))
    p = place(snap, jobset(replace(DRIVER, group="g"), replace(WORKERS, group="g")))
    assert racks_of(snap, p, "driver") == racks_of(snap, p, "workers") == {"r1"}


def test_a_free_driver_never_breaks_a_pristine_island_when_the_cpu_nodes_are_full() -> None:
    """Three driver pods, the CPU node holds only one: the drivers then go onto the nodes the
    workers use, not onto the idle r0 nodes."""
    snap = gpu_racks(cpu_node("cpu-0", cpu_milli=2000))
    p = place(snap, jobset(driver=replace(DRIVER, count=3)))
    assert not any(n.startswith("r0-") for n in nodes_of(p, "driver"))
    assert racks_of(snap, p, "workers") == {"r1"}


def test_a_large_pruned_fleet_keeps_the_workers_in_one_rack_and_the_driver_off_gpus() -> None:
    """Above solver.maxCandidateNodes the domains are pruned for the workers alone, the
    driver keeps its own cheapest nodes."""
    fleet = generate_fleet(220, seed=3, load=(0.1, 0.3))
    cpus = [
        replace(cpu_node(f"cpu-{i}", racked=False), labels={HOST: f"cpu-{i}", "role": "cpu"})
        for i in range(3)
    ]
    snap = ClusterSnapshot.of([*fleet, *cpus])
    workers = replace(WORKERS, required_level=BENCH_RACK)
    gang = replace(jobset(workers=workers), required_level=BENCH_RACK)
    cfg = bench_config(time_limit=5.0)
    solver = cfg.solver.model_copy(update={"max_candidate_nodes": 40})
    cfg = cfg.model_copy(update={"solver": solver})
    p = CpSatEngine(seed=0).place(snap, gang, cfg)
    assert violations(snap, gang, p, cfg) == []
    assert p.feasible, p.reason
    assert len({snap.nodes[n].labels[BENCH_RACK] for n in nodes_of(p, "workers")}) == 1
    assert nodes_of(p, "driver") <= {c.name for c in cpus}
    assert any("the cheapest nodes for driver" in line for line in p.explanation)


# ---------------------------------------------------------------- leader and workers


def test_lws_leader_and_workers_share_one_rack() -> None:
    """An LWS group as one Workload: a leader with GPUs and 3 workers, required rack: all 4
    in one rack, the one that holds them (r0 is tighter but too small)."""
    leader = PodSet("leader", 1, cpu_milli=8000, memory_mib=65_536, gpus=8, required_level=RACK)
    worker = PodSet("worker", 3, cpu_milli=8000, memory_mib=65_536, gpus=8, required_level=RACK)
    gang = Gang("ns/lws", (leader, worker), tier="gold",
                workload_type=WorkloadType.INFERENCE, required_level=RACK)
    snap = gpu_racks(cpu_node("cpu-0"))
    p = place(snap, gang)
    assert racks_of(snap, p, "leader") == racks_of(snap, p, "worker") == {"r1"}


def test_pod_sets_with_levels_of_their_own_are_bound_each_to_its_own() -> None:
    """`a` must sit on one host, `b` inside one rack; nothing asks them to share a rack (only
    r0 has a host for `a`, only r2 a rack for `b`)."""
    a = PodSet("a", 2, cpu_milli=1000, memory_mib=1024, gpus=4, required_level=HOST)
    b = PodSet("b", 2, cpu_milli=1000, memory_mib=1024, gpus=8, required_level=RACK)
    gang = Gang("ns/g", (a, b), tier="gold", required_level=HOST)
    snap = snapshot(
        gpu_node("r0-0", rack="r0"),
        gpu_node("r1-0", rack="r1", used=range(4)),
        gpu_node("r2-0", rack="r2"),
        gpu_node("r2-1", rack="r2"),
    )
    p = place(snap, gang)
    assert nodes_of(p, "a") == {"r0-0"}
    assert racks_of(snap, p, "b") == {"r2"}


def test_a_driver_outside_the_workers_rack_is_no_violation_but_a_bound_one_is() -> None:
    snap = gpu_racks(cpu_node("cpu-0", rack="r9"))
    p = place(snap, jobset())
    bound = jobset(driver=replace(DRIVER, required_level=RACK))
    assert violations(snap, bound, p, CONFIG) == [
        "required example.com/rack: spans 2 domains"
    ]


# ---------------------------------------------------------------- property


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    busy=st.lists(st.integers(0, 8), min_size=6, max_size=6),
    cpu_nodes=st.integers(0, 2),
    drivers=st.integers(1, 3),
    racked=st.booleans(),
)
def test_jobset_gangs_keep_workers_in_one_rack_and_drivers_off_gpus_when_they_can(
    busy: list[int], cpu_nodes: int, drivers: int, racked: bool
) -> None:
    """Whatever the load: the workers share one rack; the drivers use only CPU nodes when
    those have room for them all; the placement is sound."""
    gpu = [
        gpu_node(f"g{i}", rack=f"r{i % 3}", used=range(used)) for i, used in enumerate(busy)
    ]
    cpus = [cpu_node(f"cpu-{i}", racked=racked, cpu_milli=4000) for i in range(cpu_nodes)]
    snap = snapshot(*gpu, *cpus)
    workers = replace(WORKERS, count=2, gpus=4)
    gang = jobset(replace(DRIVER, count=drivers), workers)
    p = CpSatEngine(seed=0).place(snap, gang, CONFIG)
    assert violations(snap, gang, p, CONFIG) == []
    if not p.feasible:
        return
    assert len(racks_of(snap, p, "workers")) == 1
    cpu_room = cpu_nodes * 2  # 4 cores each, 2 per driver
    on_cpu = nodes_of(p, "driver") <= {c.name for c in cpus}
    assert on_cpu == (cpu_room >= drivers)
