"""Serving spread: replicas placed one after another spread over nodes and racks by their
siblings, the hard spread rules hold, packing types are untouched, and a tier's
allowedClasses are hard."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    PlacementConfig,
    PodSet,
    SpreadRule,
    WorkloadType,
)
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.sequence import OrderedPlacer
from nexus_admit.placement.spread import one_pod_allowed, pair_cost, rule_violations
from nexus_admit.placement.validate import violations
from tests.factories import A100, BLOCK, H100, HOST, LEVELS, RACK, T4, gpu_node, snapshot
from tests.strategies import snapshots

CONFIG = PlacementConfig.from_spec({"topology": {"levels": list(LEVELS)}})
INFERENCE = WorkloadType.INFERENCE


def _fleet() -> ClusterSnapshot:
    """Two racks of four 8-GPU nodes."""
    return snapshot(*(gpu_node(f"r{r}-{i}", rack=f"r{r}") for r in range(2) for i in range(4)))


def _replica(i: int, siblings: dict[str, int], **kw: object) -> Gang:
    return Gang(f"ns/web-{i}", (PodSet("main", 1, cpu_milli=1000, gpus=1),), tier="bronze",
                workload_type=INFERENCE, service="Deployment/ns/web", siblings=dict(siblings),
                **kw)  # type: ignore[arg-type]


def _place_replicas(count: int, snap: ClusterSnapshot, **kw: object) -> dict[str, int]:
    """A Deployment's single-pod Workloads, one after another, each told its siblings."""
    placer = OrderedPlacer(CpSatEngine(seed=0), snap)
    held: dict[str, int] = {}
    for i in range(count):
        placement = placer.place(_replica(i, held, **kw), CONFIG)
        assert placement.feasible, placement.reason
        for node, pods in placement.pods_per_node().items():
            held[node] = held.get(node, 0) + pods
    return held


def test_a_deployments_replicas_take_a_node_each_across_both_racks() -> None:
    held = _place_replicas(4, _fleet())
    assert sorted(held.values()) == [1, 1, 1, 1]
    assert {n.split("-")[0] for n in held} == {"r0", "r1"}


def test_without_siblings_the_replicas_pile_onto_one_node() -> None:
    """What the siblings change: each replica alone is a fresh one-pod gang."""
    placer = OrderedPlacer(CpSatEngine(seed=0), _fleet())
    nodes = set()
    for i in range(4):
        gang = replace(_replica(i, {}), service=None)
        nodes |= set(placer.place(gang, CONFIG).pods_per_node())
    assert len(nodes) == 1


def test_a_statefulset_gang_spreads_over_nodes_and_racks() -> None:
    gang = Gang("ns/db", (PodSet("db", 3, cpu_milli=1000, gpus=2),), workload_type=INFERENCE)
    placement = CpSatEngine(seed=0).place(_fleet(), gang, CONFIG)
    per_node = placement.pods_per_node()
    assert sorted(per_node.values()) == [1, 1, 1]
    assert {n.split("-")[0] for n in per_node} == {"r0", "r1"}
    assert placement.terms["spreadPairs"] == pair_cost(prepare(_fleet(), gang, CONFIG), per_node)


def test_a_scaled_up_replica_joins_the_emptier_rack() -> None:
    gang = _replica(5, {"r0-0": 1, "r0-1": 1, "r1-0": 1})
    placement = CpSatEngine(seed=0).place(_fleet(), gang, CONFIG)
    (node,) = placement.pods_per_node()
    assert node.startswith("r1-") and node != "r1-0"


def test_packing_types_ignore_siblings_weights_and_services() -> None:
    """Training and batch placements do not change with the spread config or a service."""
    gang = Gang("ns/train", (PodSet("w", 3, cpu_milli=1000, gpus=4),))
    snap = _fleet()
    plain = CpSatEngine(seed=0).place(snap, gang, CONFIG)
    spread = PlacementConfig.from_spec(
        {"topology": {"levels": list(LEVELS)}, "spread": {"node": 99, "domain": 7}}
    )
    tuned = CpSatEngine(seed=0).place(snap, gang, spread)
    assert tuned.slots == plain.slots
    assert tuned.terms["spreadPairs"] == plain.terms["spreadPairs"] == 0


def test_anti_affinity_keeps_replicas_off_their_siblings_nodes() -> None:
    rule = (SpreadRule(HOST, max_per_domain=1),)
    snap = snapshot(gpu_node("a"), gpu_node("b"), gpu_node("c", gpu=T4))
    gang = _replica(2, {"a": 1, "b": 1}, spread_rules=rule)
    placement = CpSatEngine(seed=0).place(snap, gang, CONFIG)
    assert placement.pods_per_node() == {"c": 1}
    full = _replica(3, {"a": 1, "b": 1, "c": 1}, spread_rules=rule)
    assert not CpSatEngine(seed=0).place(snap, full, CONFIG).feasible


def test_a_rack_skew_rule_is_hard() -> None:
    """maxSkew 1 over racks, three pods already in r0 and one in r1: the next two go to r1."""
    rule = (SpreadRule(RACK, max_skew=1),)
    gang = Gang("ns/web", (PodSet("main", 2, cpu_milli=1000, gpus=1),), workload_type=INFERENCE,
                siblings={"r0-0": 1, "r0-1": 1, "r1-0": 1, "r0-2": 1}, spread_rules=rule)
    placement = CpSatEngine(seed=0).place(_fleet(), gang, CONFIG)
    assert placement.feasible
    assert all(n.startswith("r1-") for n in placement.pods_per_node())
    problem = prepare(_fleet(), gang, CONFIG)
    assert rule_violations(problem, placement.pods_per_node()) == []
    assert rule_violations(problem, {"r0-3": 2}) == ["example.com/rack skew 4 (at most 1)"]


def test_a_rule_on_an_unknown_level_is_impossible() -> None:
    gang = _replica(0, {}, spread_rules=(SpreadRule("example.com/row", max_skew=1),))
    placement = CpSatEngine(seed=0).place(_fleet(), gang, CONFIG)
    assert not placement.feasible and "not a configured topology level" in placement.reason


def test_allowed_classes_are_hard() -> None:
    """Silver on its own class only: a free A100 island is taken over a free T4 (which
    costs less in the objective), and with the A100 full the gang does not run elsewhere."""
    spec = CONFIG.to_spec()
    spec["tiers"][1]["allowedClasses"] = ["standard"]
    config = PlacementConfig.from_spec(spec)
    gang = Gang("ns/s", (PodSet("main", 1, cpu_milli=1000, gpus=1),), tier="silver")
    snap = snapshot(gpu_node("t4", gpu=T4, gpus=4), gpu_node("a100", gpu=A100))
    assert CpSatEngine(seed=0).place(snap, gang, CONFIG).pods_per_node() == {"t4": 1}
    assert CpSatEngine(seed=0).place(snap, gang, config).pods_per_node() == {"a100": 1}
    problem = prepare(snap, gang, config)
    assert problem.rejections["main"]["outside the tier's allowedClasses"] == 1
    busy = snapshot(gpu_node("t4", gpu=T4), gpu_node("a100", gpu=A100, used=range(8)),
                    gpu_node("h100", gpu=H100))
    assert not CpSatEngine(seed=0).place(busy, gang, config).feasible
    cpu_only = Gang("ns/c", (PodSet("main", 1, cpu_milli=1000),), tier="silver")
    assert CpSatEngine(seed=0).place(busy, cpu_only, config).feasible


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snap=snapshots(max_nodes=5),
    pods=st.integers(1, 4),
    gpus=st.sampled_from((0, 1, 2)),
    kind=st.sampled_from(list(WorkloadType)),
    on=st.lists(st.integers(0, 4), max_size=3),
)
def test_spread_never_puts_more_pods_on_a_node_than_anti_affinity_allows(
    snap: ClusterSnapshot, pods: int, gpus: int, kind: WorkloadType, on: list[int]
) -> None:
    names = list(snap.nodes)
    siblings: dict[str, int] = {}
    for i in on:
        siblings[names[i % len(names)]] = 1
    gang = Gang("ns/web", (PodSet("main", pods, cpu_milli=500, gpus=gpus),), tier="bronze",
                workload_type=kind, service="Deployment/ns/web", siblings=siblings,
                spread_rules=(SpreadRule(HOST, max_per_domain=1),))
    config = PlacementConfig.from_spec({"topology": {"levels": list(LEVELS)}})
    placement = CpSatEngine(seed=0).place(snap, gang, config)
    assert violations(snap, gang, placement, config) == []
    for node, count in placement.pods_per_node().items():
        assert count + siblings.get(node, 0) <= 1
    if placement.feasible:
        assert len(placement.slots) == pods


_RULES = (
    SpreadRule(RACK, max_skew=1),
    SpreadRule(HOST, max_skew=1),
    SpreadRule(BLOCK, max_per_domain=2),
    SpreadRule(RACK, max_skew=2, max_per_domain=3),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    snap=snapshots(max_nodes=5),
    pods=st.integers(1, 4),
    kind=st.sampled_from(list(WorkloadType)),
    rules=st.lists(st.sampled_from(_RULES), min_size=1, max_size=2, unique=True),
    on=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 2)), max_size=3),
)
def test_the_engine_keeps_every_spread_rule_and_the_scan_agrees_with_the_check(
    snap: ClusterSnapshot, pods: int, kind: WorkloadType, rules: list[SpreadRule],
    on: list[tuple[int, int]],
) -> None:
    names = list(snap.nodes)
    siblings = {names[i % len(names)]: n for i, n in on}
    gang = Gang("ns/web", (PodSet("main", pods, cpu_milli=500, gpus=1),), tier="bronze",
                workload_type=kind, service="StatefulSet/ns/web", siblings=siblings,
                spread_rules=tuple(rules))
    placement = CpSatEngine(seed=0).place(snap, gang, CONFIG)
    assert violations(snap, gang, placement, CONFIG) == []
    one = replace(gang, pod_sets=(PodSet("main", 1, cpu_milli=500, gpus=1),))
    problem = prepare(snap, one, CONFIG)
    allowed = one_pod_allowed(problem)
    for name in names:
        assert allowed(name) == (rule_violations(problem, {name: 1}) == []), name
