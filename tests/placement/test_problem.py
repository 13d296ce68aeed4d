"""Problem preparation: eligibility memoised on the snapshot must not leak between configs."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_admit.model import (
    NVLINK_CLIQUE_LEVEL,
    ClusterSnapshot,
    Gang,
    Node,
    NodeSelectorRequirement,
    PodSet,
)
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.problem import prepare
from tests.factories import BLOCK, HOST, RACK, config, gpu_node, snapshot
from tests.strategies import CONFIG as S_CONFIG
from tests.strategies import RACK as S_RACK
from tests.strategies import gangs, nodes


def test_required_level_eligibility_is_keyed_by_the_label_not_its_position() -> None:
    """Under both configs the required level is the second level, but a different label:
    the node without a rack label is out for the first and in for the second."""
    zone = "example.com/zone"
    snap = snapshot(gpu_node("racked"), gpu_node("unracked"))
    del snap.nodes["unracked"].labels[RACK]
    for node in snap:
        node.labels[zone] = "z0"
    by_rack = prepare(snap, Gang("ns/a", (PodSet("w", 1, gpus=1),), required_level=RACK),
                      config((BLOCK, RACK, HOST)))
    assert by_rack.candidates["w"] == ["racked"]
    by_block = prepare(snap, Gang("ns/b", (PodSet("w", 1, gpus=1),), required_level=BLOCK),
                       config((zone, BLOCK, HOST)))
    assert by_block.candidates["w"] == ["racked", "unracked"]


def test_idle_room_counts_whole_gangs_per_domain_as_if_the_nodes_were_idle() -> None:
    snap = snapshot(gpu_node("a", used=range(8), rack="r0"), gpu_node("b", rack="r0"),
                    gpu_node("c", used=range(2), rack="r1"))
    problem = prepare(snap, Gang("ns/g", (PodSet("w", 2, gpus=4),)), config())
    rack = problem.level_index(RACK)
    assert problem.idle_room(rack) == {("b0", "r0"): 2, ("b0", "r1"): 1}
    # memoised per snapshot: a second problem reads the same answer
    assert prepare(snap, Gang("ns/h", (PodSet("w", 2, gpus=4),)), config()).idle_room(rack) == \
        {("b0", "r0"): 2, ("b0", "r1"): 1}


# ---- ComputeDomains: a gang sharing a multi-node NVLink channel stays in one clique ----

CLIQUE = NVLINK_CLIQUE_LEVEL


def _clique_node(name: str, clique: str | None, rack: str, used: range = range(0)) -> Node:
    labels = {CLIQUE: clique} if clique else {}
    return gpu_node(name, rack=rack, clique=clique, labels=labels, used=used)


def _clique_fleet() -> ClusterSnapshot:
    """Clique A (rack r0) with 2 of its 4 nodes full, clique B (rack r1) idle, and rack r2
    whose nodes are in no clique."""
    nodes = [_clique_node(f"a{i}", "A", "r0", range(8) if i < 2 else range(0)) for i in range(4)]
    nodes += [_clique_node(f"b{i}", "B", "r1") for i in range(4)]
    nodes += [_clique_node(f"c{i}", None, "r2") for i in range(4)]
    return snapshot(*nodes)


def _cd_gang(name: str, pods: int, level: str = CLIQUE, **kw: object) -> Gang:
    ps = PodSet("w", pods, gpus=8, required_level=level, compute_domain=f"{name}-channel")
    return Gang(name, (ps,), required_level=level, **kw)  # type: ignore[arg-type]


def test_the_clique_heads_the_levels_of_a_compute_domain_gang_only() -> None:
    snap = _clique_fleet()
    cd = prepare(snap, _cd_gang("ns/cd", 2), config())
    assert cd.levels == (CLIQUE, BLOCK, RACK, HOST)
    assert cd.candidates["w"] == [f"{c}{i}" for c in "ab" for i in range(4)]  # static: full too
    assert cd.rejections["w"]["in no NVLink clique (no nvidia.com/gpu.clique label)"] == 4
    plain = prepare(snap, Gang("ns/p", (PodSet("w", 2, gpus=8),)), config())
    assert plain.levels == (BLOCK, RACK, HOST)
    assert "c0" in plain.candidates["w"]
    # a config naming the clique itself keeps its own order
    named = prepare(snap, _cd_gang("ns/cd", 2), config((BLOCK, CLIQUE, HOST)))
    assert named.levels == (BLOCK, CLIQUE, HOST)


def test_a_compute_domain_gang_stays_inside_one_clique_and_keeps_the_others_whole() -> None:
    """3 × 8 GPUs: clique A has 2 free nodes, B 4. Spanning A's two and one of B would use the
    partly used clique first; the clique is required, so the gang takes 3 nodes of B only."""
    snap = _clique_fleet()
    placement = CpSatEngine().place(snap, _cd_gang("ns/cd", 3), config())
    assert placement.feasible
    assert {snap.nodes[s.node].clique for s in placement.slots} == {"B"}
    # with two nodes of B full as well, no clique holds 3 pods: the gang waits, while a gang
    # without a ComputeDomain spans the two cliques' free nodes
    for name in ("b0", "b1"):
        snap.nodes[name].gpu_free = [0] * 8
    for name in ("c0", "c1", "c2", "c3"):
        del snap.nodes[name]
    assert not CpSatEngine().place(snap, _cd_gang("ns/cd", 3), config()).feasible
    assert CpSatEngine().place(snap, Gang("ns/p", (PodSet("w", 3, gpus=8),)), config()).feasible


def test_a_level_under_the_clique_is_qualified_by_it() -> None:
    """A rack spanning two cliques: a gang required in one rack still stays in one clique."""
    nodes = [_clique_node(f"x{i}", "X" if i < 2 else "Y", "r0") for i in range(4)]
    snap = snapshot(*nodes)
    placement = CpSatEngine().place(snap, _cd_gang("ns/cd", 3, level=RACK), config())
    assert not placement.feasible  # two nodes per clique: 3 pods fit in neither
    two = CpSatEngine().place(snap, _cd_gang("ns/cd", 2, level=RACK), config())
    assert two.feasible and len({snap.nodes[s.node].clique for s in two.slots}) == 1


def test_cliques_other_compute_domains_hold_are_closed_to_the_gang() -> None:
    snap = _clique_fleet()
    gang = replace(_cd_gang("ns/cd", 2), closed_cliques=frozenset({"B"}))
    placement = CpSatEngine().place(snap, gang, config())
    assert placement.feasible
    assert {snap.nodes[s.node].clique for s in placement.slots} == {"A"}
    every = replace(gang, closed_cliques=frozenset({"A", "B"}))
    problem = prepare(snap, every, config())
    assert problem.candidates["w"] == []
    assert problem.rejections["w"]["NVLink clique held by another ComputeDomain"] == 8
    assert problem.impossible == ""  # the cliques open again when those domains finish
    waits = CpSatEngine().place(snap, every, config())
    assert not waits.feasible
    assert "8 nodes are in NVLink cliques other ComputeDomains hold" in waits.explanation[0]
    assert "will retry" in waits.explanation[0]
    # memoised candidates are not shared with a gang for which the cliques are open
    assert len(prepare(snap, _cd_gang("ns/other", 2), config()).candidates["w"]) == 8


@st.composite
def _mixed_fleets(draw: st.DrawFn) -> list[Node]:
    """Nodes copied from a few templates (so many are alike), some cordoned, some of
    another size, some without a rack label."""
    templates = draw(st.lists(nodes("t"), min_size=1, max_size=3))
    out = []
    for i in range(draw(st.integers(1, 10))):
        node = replace(draw(st.sampled_from(templates)).copy(), name=f"n{i}")
        node.schedulable = draw(st.integers(0, 4)) > 0
        node.cpu_milli = draw(st.sampled_from((node.cpu_milli, 2000)))
        if draw(st.integers(0, 3)) == 0:
            node.labels = {k: v for k, v in node.labels.items() if k != S_RACK}
        out.append(node)
    return out


@settings(max_examples=300, deadline=None)
@given(fleet=_mixed_fleets(), gang=gangs(), rack=st.booleans())
def test_candidates_and_rejections_are_each_nodes_own_static_fit(
    fleet: list[Node], gang: Gang, rack: bool
) -> None:
    """prepare answers nodes alike in what the filters read once: the same candidates, in
    snapshot order, and the same reasons as asking every node."""
    if rack:  # the rack label then rules nodes out
        gang = replace(gang, required_level=S_RACK)
    problem = prepare(ClusterSnapshot.of(fleet), gang, S_CONFIG)
    for ps in gang.pod_sets:
        level = gang.level_of(ps)
        expected: list[str] = []
        why: Counter[str] = Counter()
        for node in fleet:
            reason = ps.static_fit(node)
            if reason is None and level is not None and level not in node.labels:
                reason = f"no {level} label"
            if reason is None and ps.gpus and problem.node_class[node.name] not in (
                S_CONFIG.allowed_classes(gang.tier) or {problem.node_class[node.name]}
            ):
                reason = "outside the tier's allowedClasses"
            if reason is None:
                expected.append(node.name)
            else:
                why[reason] += 1
        assert problem.candidates[ps.name] == expected
        assert problem.rejections[ps.name] == why


_MODEL = "example.com/gpu-model"
_requirements = st.builds(
    NodeSelectorRequirement,
    st.sampled_from((_MODEL, "pool")),
    st.sampled_from(("In", "NotIn", "Exists", "DoesNotExist")),
    st.lists(st.sampled_from(("T4", "A10", "a", "b")), max_size=2).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(fleet=_mixed_fleets(), gang=gangs(max_sets=1),
       labels=st.lists(st.tuples(st.sampled_from((None, "T4", "A10")),
                                 st.sampled_from((None, "a", "b"))), min_size=10, max_size=10),
       selector=st.dictionaries(st.sampled_from((_MODEL, "pool")), st.sampled_from(("T4", "a"))),
       affinity=st.lists(st.lists(_requirements, min_size=1, max_size=2).map(tuple),
                         max_size=2).map(tuple))
def test_candidates_of_a_pod_set_with_a_selector_are_each_nodes_own_static_fit(
    fleet: list[Node], gang: Gang, labels: list[tuple[str | None, str | None]],
    selector: dict[str, str], affinity: tuple[tuple[NodeSelectorRequirement, ...], ...],
) -> None:
    """Nodes alike but in the labels a node selector or affinity reads are told apart by
    those labels' values (openb's GPU-model-pinned pods): the same candidates, in snapshot
    order, and the same reasons as asking every node."""
    for node, (model, pool) in zip(fleet, labels, strict=False):
        node.labels = {k: v for k, v in node.labels.items() if k not in (_MODEL, "pool")}
        node.labels.update({k: v for k, v in ((_MODEL, model), ("pool", pool)) if v})
    ps = replace(gang.pod_sets[0], node_selector=selector, affinity_terms=affinity)
    gang = replace(gang, pod_sets=(ps,), required_level=None)
    problem = prepare(ClusterSnapshot.of(fleet), gang, S_CONFIG)
    allowed = S_CONFIG.allowed_classes(gang.tier)
    expected: list[str] = []
    why: Counter[str] = Counter()
    for node in fleet:
        reason = ps.static_fit(node)
        if reason is None and ps.gpus and allowed and problem.node_class[node.name] not in allowed:
            reason = "outside the tier's allowedClasses"
        if reason is None:
            expected.append(node.name)
        else:
            why[reason] += 1
    assert problem.candidates[ps.name] == expected
    assert problem.rejections[ps.name] == why
