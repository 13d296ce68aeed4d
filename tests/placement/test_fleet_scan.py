"""The one-pod scan on columns (`fleet_scan`) against the scan over node objects it
replaces (`candidates`, `shortfall`, `scan_candidates`): the same answer on random fleets,
its bounds bit for bit, and the columns it reads (paths, free GPUs per domain) equal to
what they stand for."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_admit.model import (
    ClusterSnapshot,
    Domain,
    Gang,
    Node,
    Placement,
    PlacementConfig,
    PodSet,
    domain_path,
)
from nexus_admit.placement.baselines.podbypod import infeasible
from nexus_admit.placement.columns import candidate_columns, level_codes
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.fleet_scan import column_bounds, columns_serve, fleet_scan
from nexus_admit.placement.fragmentation import WorkloadDistribution
from nexus_admit.placement.memo import NodeMemo
from nexus_admit.placement.objective import term_weights
from nexus_admit.placement.onepod import scan_candidates, scan_lower_bound, scans
from nexus_admit.placement.order_terms import OrderTerms
from nexus_admit.placement.problem import NodeClasses, NodePaths, _filter_nodes, prepare
from nexus_admit.placement.reduction import candidates, shortfall
from tests.placement.test_live_reduction import fleets
from tests.placement.test_onepod import one_pod_gangs
from tests.strategies import BLOCK, CONFIG, LEVELS, RACK, gangs

HOST = "kubernetes.io/hostname"

# islands from 4 GPUs: 4-GPU nodes break islands too
STRICT = CONFIG.model_copy(update={"island_min_gpus": 4})


def _answer(p: Placement) -> tuple[object, ...]:
    return (p.feasible, p.status, p.slots, p.reason, p.terms, p.objective, p.model_objective,
            p.explanation)


def _over_objects(snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> Placement:
    """The one-pod scan as it was: candidates and their bounds node by node."""
    problem = prepare(snapshot, gang, config)
    memo = NodeMemo()
    memo.sync(snapshot, config)
    red = candidates(problem, memo)
    short = shortfall(problem, red)
    if short:
        return infeasible(gang, "nexus", short, 0.0)
    terms = OrderTerms(memo, WorkloadDistribution.default())
    return scan_candidates(problem, red, memo, 0.0, terms, "nexus")


def _on_columns(snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig
                ) -> Placement | None:
    problem = prepare(snapshot, gang, config)
    if problem.impossible or problem.unavailable or not scans(problem):
        return None
    memo = NodeMemo()
    memo.sync(snapshot, config)
    return fleet_scan(problem, memo, 0.0, OrderTerms(memo, WorkloadDistribution.default()),
                      "nexus")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), fleet=fleets(), strict=st.booleans())
def test_the_scan_on_columns_answers_as_the_scan_over_objects(
    data: st.DataObject, fleet: list[Node], strict: bool
) -> None:
    config = STRICT if strict else CONFIG
    snapshot = ClusterSnapshot.of(fleet)
    gang = data.draw(one_pod_gangs([n.name for n in fleet]))
    placed = _on_columns(snapshot, gang, config)
    if placed is None:
        return
    assert _answer(placed) == _answer(_over_objects(snapshot, gang, config))
    # the engine takes it on a plain snapshot, and answers the same
    assert _answer(CpSatEngine(0).place(snapshot, gang, config))[:-1] == _answer(placed)[:-1]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), fleet=fleets())
def test_a_quantity_past_64_bits_is_read_node_by_node(
    data: st.DataObject, fleet: list[Node]
) -> None:
    """A malformed dump's free CPU of 10**20 millicores: the scan answers as over objects
    (and the engine places), never an overflow."""
    for node in fleet[:1]:
        node.free_cpu_milli = 10**20
    snapshot = ClusterSnapshot.of(fleet)
    gang = data.draw(one_pod_gangs([n.name for n in fleet]))
    placed = _on_columns(snapshot, gang, CONFIG)
    if placed is not None:
        assert _answer(placed) == _answer(_over_objects(snapshot, gang, CONFIG))
    CpSatEngine(0).place(snapshot, gang, CONFIG)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gang=gangs(max_sets=1, max_count=1), fleet=fleets(), strict=st.booleans())
def test_the_bounds_on_columns_are_each_nodes_bound_bit_for_bit(
    gang: Gang, fleet: list[Node], strict: bool
) -> None:
    """Every candidate, with room or not: the ranking's order (and ties) is the bound's."""
    snapshot = ClusterSnapshot.of(fleet)
    problem = prepare(snapshot, gang, STRICT if strict else CONFIG)
    names = problem.candidates[gang.pod_sets[0].name]
    if problem.impossible or not names or not columns_serve(problem):
        return
    weights = term_weights(problem)
    cols = candidate_columns(snapshot, names, problem.node_class)
    everyone = np.arange(len(names), dtype=np.int64)
    whole = np.array([snapshot.nodes[n].free_whole_gpus for n in names], dtype=np.int64)
    bounds = column_bounds(problem, cols, everyone, whole, weights)
    assert bounds.tolist() == [scan_lower_bound(problem, n, weights) for n in names]


@settings(max_examples=200, deadline=None)
@given(gang=gangs(max_sets=1), fleet=fleets())
def test_the_candidate_columns_are_each_candidates_own(gang: Gang, fleet: list[Node]) -> None:
    """Gathered from the snapshot's kinds: each candidate's place, class, VRAM and GPUs."""
    snapshot = ClusterSnapshot.of(fleet)
    problem = prepare(snapshot, gang, CONFIG)
    names = problem.candidates[gang.pod_sets[0].name]
    if not names:
        return
    cols = candidate_columns(snapshot, names, problem.node_class)
    order = list(snapshot.nodes)
    assert cols.where.tolist() == [order.index(n) for n in names]
    assert cols.place.tolist() == [names.index(n) if n in names else -1 for n in order]
    nodes = [snapshot.nodes[n] for n in names]
    assert [cols.classes[c] for c in cols.hw_class.tolist()] == [
        CONFIG.hardware_class(n.gpu_product) if n.gpu_free else None for n in nodes]
    assert cols.vram.tolist() == [n.gpu_memory_mib for n in nodes]
    assert cols.gpu_count.tolist() == [n.gpu_count for n in nodes]


def test_the_columns_serve_no_gang_with_siblings_or_of_several_pods() -> None:
    fleet = [Node(name="n0", labels={RACK: "r0"}, cpu_milli=8000, free_cpu_milli=8000)]
    gang = Gang("ns/g", (replace(_one_pod(), count=2),))
    assert not columns_serve(prepare(ClusterSnapshot.of(fleet), gang, CONFIG))
    gang = Gang("ns/g", (_one_pod(),), service="svc", siblings={"n0": 1})
    assert not columns_serve(prepare(ClusterSnapshot.of(fleet), gang, CONFIG))
    assert columns_serve(prepare(ClusterSnapshot.of(fleet), Gang("ns/g", (_one_pod(),)), CONFIG))


def _one_pod() -> PodSet:
    return PodSet("ps", 1, cpu_milli=1000)


labels = st.dictionaries(st.sampled_from((BLOCK, RACK, "zone")), st.sampled_from(("a", "b")))


@given(st.lists(labels, max_size=12), st.permutations((BLOCK, RACK, "zone", HOST)),
       st.integers(1, 4), st.integers(0, 3))
def test_paths_read_when_asked_and_domain_codes_are_each_nodes_path(
    label_sets: list[dict[str, str]], order: list[str], take: int, level: int
) -> None:
    """Whatever the levels (the hostname anywhere, or absent) and missing labels."""
    fleet = [Node(name=f"n{i}", labels=ls) for i, ls in enumerate(label_sets)]
    snapshot = ClusterSnapshot.of(fleet)
    levels = tuple(order[:take])
    paths = NodePaths(snapshot.nodes, levels)
    for node in reversed(fleet):
        assert node.name in paths
        assert paths[node.name] == paths.get(node.name) == domain_path(node, levels)
    assert "elsewhere" not in paths and paths.get("elsewhere") is None
    if level >= len(levels):
        return
    labelled = [Node(name=n.name, labels={BLOCK: "x", RACK: "x", "zone": "x", **n.labels})
                for n in fleet]  # and with every label: read in one pass
    for nodes in (fleet, labelled):
        codes = level_codes(ClusterSnapshot.of(nodes), levels, level)
        at = [domain_path(node, levels)[level] for node in nodes]
        assert [None if c < 0 else codes.domains[c] for c in codes.codes.tolist()] == at
        assert codes.domains == list(dict.fromkeys(d for d in at if d is not None))


@settings(max_examples=200, deadline=None)
@given(fleet=fleets(), level=st.integers(0, len(LEVELS) - 1))
def test_the_free_gpus_per_domain_on_columns_are_the_count_over_every_node(
    fleet: list[Node], level: int
) -> None:
    snapshot = ClusterSnapshot.of(fleet)
    problem = prepare(snapshot, Gang("ns/g", (_one_pod(),)), CONFIG)
    expected: dict[Domain, int] = defaultdict(int)
    for node in snapshot:
        if node.gpu_free and (domain := problem.paths[node.name][level]) is not None:
            expected[domain] += sum(node.gpu_free)
    got = problem.domain_free_gpu_milli(level)
    assert list(got.items()) == list(expected.items())


@settings(max_examples=200, deadline=None)
@given(fleet=fleets())
def test_the_pristine_cliques_in_one_pass_are_the_count_over_every_node(
    fleet: list[Node],
) -> None:
    snapshot = ClusterSnapshot.of(fleet)
    pristine = snapshot.pristine_cliques()
    expected: dict[str, list[str]] = {}
    for node in snapshot:
        if node.clique in pristine:
            expected.setdefault(node.clique, []).append(node.name)
    got = prepare(snapshot, Gang("ns/g", (_one_pod(),)), CONFIG).pristine_cliques
    assert list(got.items()) == list(expected.items())


@settings(max_examples=200, deadline=None)
@given(gang=gangs(max_sets=1), fleet=fleets())
def test_the_static_filter_by_kind_rules_as_node_by_node(gang: Gang, fleet: list[Node]) -> None:
    """Naming every node (`allowed_nodes`) takes the filter node by node: same answers."""
    snapshot = ClusterSnapshot.of(fleet)
    ps = gang.pod_sets[0]
    problem = prepare(snapshot, gang, CONFIG)
    if problem.impossible.startswith("tier") or ps.node_selector:
        return
    level = problem._label_level(ps)
    req = problem.levels.index(level) if level is not None else None
    allowed = CONFIG.allowed_classes(gang.tier) if ps.gpus else None
    named = replace(ps, allowed_nodes=frozenset(snapshot.nodes))
    levels = problem.levels
    by_kind = _filter_nodes(snapshot, ps, problem.paths, problem.node_class, levels, req,
                            allowed)
    one_by_one = _filter_nodes(snapshot, named, problem.paths, problem.node_class, levels, req,
                               allowed)
    assert by_kind[0] == one_by_one[0]
    assert list(by_kind[1].items()) == list(one_by_one[1].items())


@settings(max_examples=100, deadline=None)
@given(fleet=fleets())
def test_the_classes_matched_per_product_are_each_nodes_class(fleet: list[Node]) -> None:
    snapshot = ClusterSnapshot.of(fleet)
    expected = {n.name: CONFIG.hardware_class(n.gpu_product) if n.gpu_free else None
                for n in fleet}
    classes = NodeClasses(snapshot.nodes, CONFIG)
    for name in reversed(list(expected)):  # read in any order: each node's own class
        assert name in classes
        assert classes[name] == classes.get(name) == expected[name]
    assert "elsewhere" not in classes and classes.get("elsewhere") is None
