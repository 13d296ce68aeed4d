"""The per-snapshot caches of a TrackedSnapshot (live_reduction.py, live_facts.py) answer
exactly what the engine computes afresh: same nodes, same GPUs, same objective, same
explanation, after any sequence of placements, releases and nodes changed by other means."""

from __future__ import annotations

import re
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_admit.model import GPU_WHOLE, Gang, Node, Placement, PlacementConfig, PodSet, Slot
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.live_reduction import live_reduction
from nexus_admit.placement.memo import NodeMemo
from nexus_admit.placement.objective import term_weights
from nexus_admit.placement.onepod import (
    gradient_bounds,
    scan_lower_bound,
    scans,
    scans_with_gradient,
)
from nexus_admit.placement.order_terms import OrderTerms
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.reduction import candidates, reduce_symmetry, shortfall
from nexus_admit.placement.tracking import TrackedSnapshot
from tests.strategies import BLOCK, CONFIG, RACK, gangs, nodes


@st.composite
def fleets(draw: st.DrawFn, rackless: bool = False) -> list[Node]:
    """Up to 14 nodes made from a few templates, so that many are interchangeable (the
    symmetry classes the caches keep), spread over racks and blocks, half of them idle.
    `rackless`: some nodes in no rack (as openb's), whose bounds read no rack's GPUs."""
    templates = draw(st.lists(nodes("t"), min_size=1, max_size=4))
    out = []
    for i in range(draw(st.integers(2, 14))):
        template = draw(st.sampled_from(templates))
        labels = {**template.labels, RACK: draw(st.sampled_from(("r0", "r1", "r2")))}
        if rackless and draw(st.booleans()):
            del labels[RACK]
        if draw(st.booleans()):
            labels[BLOCK] = draw(st.sampled_from(("b0", "b1")))
        node = replace(template.copy(), name=f"n{i}", labels=labels)
        if draw(st.booleans()):  # pristine: whole NVLink cliques (8-GPU nodes) then occur
            node.gpu_free = [GPU_WHOLE] * len(node.gpu_free)
        out.append(node)
    return out


# what happens between two decisions
steps = st.one_of(
    st.tuples(st.just("place"), gangs(max_sets=1, max_count=1)),
    st.tuples(st.just("place"), gangs(max_sets=1, max_count=1)),
    st.tuples(st.just("place"), gangs(max_sets=1, max_count=1)),
    st.tuples(st.just("place"), gangs(max_sets=2, max_count=3)),
    st.tuples(st.just("again"), st.integers(0, 20)),  # a shape placed before, once more
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("touch"), st.integers(0, 20), st.integers(0, 7), st.booleans()),
)


def _answer(p: Placement) -> tuple[object, ...]:
    """Everything a placement says but how long it took (a solve reports its time)."""
    explanation = [re.sub(r" in [0-9.]+s ", " in (time) ", line) for line in p.explanation]
    return (p.feasible, p.status, p.slots, p.reason, p.terms, p.objective, p.model_objective,
            explanation, p.retry_after_seconds)


def _flip_gpu(tracked: TrackedSnapshot, which: int, gpu: int, replace_node: bool) -> None:
    """A node changed by other means (a pod bound or gone): one GPU taken or given back,
    on a new node object (as the live snapshot copies it) or in place; then touched."""
    names = list(tracked.nodes)
    name = names[which % len(names)]
    node = tracked.nodes[name].copy() if replace_node else tracked.nodes[name]
    if node.gpu_free:
        i = gpu % len(node.gpu_free)
        node.gpu_free[i] = 0 if node.gpu_free[i] == GPU_WHOLE else GPU_WHOLE
    else:
        node.free_cpu_milli = max(0, node.free_cpu_milli - 1000)
    tracked.nodes[name] = node
    tracked.touch([name])


# the openb study's objective: fragGradient and fillOrder on (one-pod gangs take the
# gradient scan, its ranking kept on the tracker)
GRADIENT = CONFIG.model_copy(update={"weights": CONFIG.weights.model_copy(
    update={"frag_gradient": 1000, "fill_order": 1500})})


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(fleets(), st.lists(steps, min_size=1, max_size=14))
def test_decisions_on_one_tracked_snapshot_equal_fresh_ones(
    start: list[Node], sequence: list[tuple[object, ...]]
) -> None:
    """One engine places on one TrackedSnapshot (its caches carried from decision to
    decision); at every step a new engine on a plain copy of the same state (no change log:
    every fact counted afresh) must give the same answer, explanation included."""
    _decide_tracked_and_fresh(start, sequence, CONFIG)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(fleets(rackless=True), st.lists(steps, min_size=1, max_size=14))
def test_decisions_under_frag_gradient_on_one_tracked_snapshot_equal_fresh_ones(
    start: list[Node], sequence: list[tuple[object, ...]]
) -> None:
    """As above under fragGradient and fillOrder: the gradient scan's ranking kept on
    the tracker (each bound with the node's fill rank and fragGradient) ranks, and so
    places, as the scan over a fresh reduction."""
    _decide_tracked_and_fresh(start, sequence, GRADIENT)


def _decide_tracked_and_fresh(
    start: list[Node], sequence: list[tuple[object, ...]], config: PlacementConfig
) -> None:
    tracked = TrackedSnapshot.of(n.copy() for n in start)
    kept = CpSatEngine(seed=0)
    placed: list[tuple[Gang, list[Slot]]] = []
    shapes: list[Gang] = []
    for i, step in enumerate(sequence):
        if step[0] == "release":
            if placed:
                tracked.release(*placed.pop(int(step[1]) % len(placed)))  # type: ignore[call-overload]
            continue
        if step[0] == "touch":
            _flip_gpu(tracked, int(step[1]), int(step[2]), bool(step[3]))  # type: ignore[call-overload]
            continue
        if step[0] == "again":
            if not shapes:
                continue
            template = shapes[int(step[1]) % len(shapes)]  # type: ignore[call-overload]
        else:
            template = step[1]  # type: ignore[assignment]
            shapes.append(template)
        gang = replace(template, name=f"ns/g{i}")
        _check_caches(tracked, gang, config, kept)
        fresh = CpSatEngine(seed=0).place(tracked.copy(), gang, config)
        reused = kept.place(tracked, gang, config)
        assert _answer(reused) == _answer(fresh)
        if reused.feasible:
            tracked.apply(gang, reused.slots)
            placed.append((gang, reused.slots))


def _check_caches(
    tracked: TrackedSnapshot, gang: Gang, config: PlacementConfig = CONFIG,
    engine: CpSatEngine | None = None,
) -> None:
    """Each cache against the same fact counted afresh on a plain copy: pristine cliques,
    free GPUs per domain, the candidates' shortfall, the reduction and the one-pod scan's
    ranking (a stale entry that changes no placement still fails here). `engine`: the one
    deciding on `tracked`, whose order terms a kept gradient ranking reads."""
    copy = tracked.copy()
    kept, fresh = prepare(tracked, gang, config), prepare(copy, gang, config)
    assert list(kept.pristine_cliques.items()) == list(fresh.pristine_cliques.items())
    for level in range(len(fresh.levels) - 1):
        assert list(kept.domain_free_gpu_milli(level).items()) == list(
            fresh.domain_free_gpu_milli(level).items()
        )
    memo, fresh_memo = NodeMemo(), NodeMemo()
    memo.sync(tracked, config)
    fresh_memo.sync(copy, config)
    live = live_reduction(kept, memo)
    if live is None or fresh.impossible:
        return
    red = candidates(fresh, fresh_memo)
    assert live.shortfall(kept) == shortfall(fresh, red)
    reduced = reduce_symmetry(fresh, red, fresh_memo)
    answer = live.reduction(kept)
    assert answer == reduced
    assert list(answer.caps.items()) == list(reduced.caps.items())
    if scans(fresh):
        weights = term_weights(fresh)
        expected = sorted(
            (scan_lower_bound(fresh, n, weights), i, n) for i, n in enumerate(reduced.nodes)
        )
        ranking = live.ranking(kept)
        assert [(b, n) for b, _, n in ranking.ranked] == [(b, n) for b, _, n in expected]
        # reported as the scan over the candidates reports it (scan_candidates)
        assert (ranking.units, ranking.notes) == (len(red.nodes), red.notes)
    if scans_with_gradient(fresh) and engine is not None:
        terms = engine._terms  # the deciding engine's: its kept ranking is read here
        fresh_terms = OrderTerms(fresh_memo, terms.workload)
        bounds = gradient_bounds(fresh, reduced.nodes, term_weights(fresh), fresh_terms)
        expected = sorted(zip(bounds, range(len(bounds)), reduced.nodes, strict=True))
        memo_of_engine = engine._memo
        memo_of_engine.sync(tracked, config)
        ranking = live_reduction(kept, memo_of_engine).ranking(kept, terms)  # type: ignore[union-attr]
        assert [(b, n) for b, _, n in ranking.ranked] == [(b, n) for b, _, n in expected]
        # reported as gradient_scan reports the reduction it ranks
        assert (ranking.units, ranking.notes) == (len(reduced.nodes), reduced.notes)


def _node(name: str, rack: str, free: list[int]) -> Node:
    return Node(name=name, labels={BLOCK: "b0", RACK: rack}, taints=(), cpu_milli=64_000,
                memory_mib=262_144, max_pods=16, gpu_product="NVIDIA-H100-80GB-HBM3",
                gpu_memory_mib=81559, gpu_free=free, free_cpu_milli=64_000,
                free_memory_mib=262_144, free_pods=16)


def test_a_tracker_reads_again_only_what_changed_and_starts_over_on_a_new_snapshot() -> None:
    """The tracker lives in the snapshot's static_cache: the next decision reuses it, a
    copy of the snapshot (no change log) gets none, a relabelled snapshot a new one."""
    tracked = TrackedSnapshot.of(_node(f"n{i}", f"r{i % 2}", [GPU_WHOLE] * 8) for i in range(6))
    gang = _one_gpu()
    memo = NodeMemo()
    memo.sync(tracked, CONFIG)
    first = live_reduction(prepare(tracked, gang, CONFIG), memo)
    assert first is not None
    tracked.apply(gang, [Slot("main", 0, "n0", (0,), None)])
    memo.sync(tracked, CONFIG)
    again = live_reduction(prepare(tracked, gang, CONFIG), memo)
    assert again is first
    assert live_reduction(prepare(tracked.copy(), gang, CONFIG), memo) is None
    tracked.static_cache.clear()  # as a label change does
    assert live_reduction(prepare(tracked, gang, CONFIG), memo) is not first


def _one_gpu() -> Gang:
    return Gang("ns/one", (PodSet("main", 1, 1000, 1024, gpus=1),), tier="gold")


def _count_bounds(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The names the one-pod scan computes a lower bound for, from now on."""
    import nexus_admit.placement.live_reduction as live_mod

    bounded: list[str] = []
    real = live_mod.lower_bounds

    def counting(problem, names, weights):  # type: ignore[no-untyped-def]
        bounded.extend(names)
        return real(problem, names, weights)

    monkeypatch.setattr(live_mod, "lower_bounds", counting)
    return bounded


def _racks_of_classes() -> TrackedSnapshot:
    """8 racks of 6 nodes, most nodes a class of their own (free GPUs, rack)."""
    return TrackedSnapshot.of(
        _node(f"n{i}", f"r{i % 8}", [GPU_WHOLE] * (1 + i % 7) + [0] * (7 - i % 7))
        for i in range(48)
    )


def test_alternating_tiers_of_one_pod_shape_keep_their_rankings(monkeypatch) -> None:
    """Gold and bronze one-GPU pods share a tracker (same candidates, same shape); each
    tier's ranking is kept beside the other's, so after a placement the next decision of
    either tier bounds only the nodes that changed and their rack mates, not the fleet,
    and ranks exactly as afresh."""
    bounded = _count_bounds(monkeypatch)
    tracked = _racks_of_classes()
    engine = CpSatEngine(seed=0)
    gold, bronze = _one_gpu(), replace(_one_gpu(), tier="bronze")
    for gang in (gold, bronze):  # each tier's first decision ranks every candidate
        placement = engine.place(tracked, gang, CONFIG)
        assert placement.fleet_scan is True  # gold builds the tracker, bronze its ranking
        tracked.apply(gang, placement.slots)
    for i in range(4):
        gang = replace(gold if i % 2 else bronze, name=f"ns/g{i}")
        bounded.clear()
        _check_caches(tracked, gang)  # the kept ranking equals a fresh one
        # two placements since this tier's last decision: their racks' nodes (12) and the
        # classes whose first node changed, not all 45 ranked again
        assert 0 < len(bounded) <= 16, bounded
        placement = engine.place(tracked, gang, CONFIG)
        assert placement.fleet_scan is False
        tracked.apply(gang, placement.slots)


def test_a_warmed_shape_is_placed_without_ranking_the_fleet_and_as_without_the_warm(
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    """`warm` builds the tracker and the tier's ranking ahead; the decision that follows
    bounds only what changed since, and answers as an engine that never warmed."""
    bounded = _count_bounds(monkeypatch)
    tracked = _racks_of_classes()
    engine, gang = CpSatEngine(seed=0), _one_gpu()
    assert engine.warm(tracked, gang, CONFIG)
    assert len(bounded) > 16, "the warm ranked the fleet"
    _flip_gpu(tracked, 5, 0, replace_node=True)  # a change between the warm and the decision
    bounded.clear()
    placement = engine.place(tracked, gang, CONFIG)
    assert 0 < len(bounded) <= 8, bounded
    assert placement.fleet_scan is False, "the warm derived what the decision reads"
    fresh = CpSatEngine(seed=0).place(tracked.copy(), gang, CONFIG)
    assert _answer(placement) == _answer(fresh)
    assert fresh.fleet_scan is True, "a plain snapshot keeps nothing: every decision scans"
    assert not engine.warm(tracked.copy(), gang, CONFIG), "nothing kept on a plain snapshot"
    assert not CpSatEngine(seed=0, reduce=False).warm(tracked, gang, CONFIG)


def test_a_decision_says_whether_it_derived_its_facts_over_the_fleet() -> None:
    """`Placement.fleet_scan`: True for the first decision of a shape on a snapshot (and
    again on a renewed one), False while a later one reuses the kept facts; the flag never
    changes the answer."""
    tracked = _racks_of_classes()
    engine = CpSatEngine(seed=0)
    pair = Gang("ns/pair", (PodSet("w", 2, cpu_milli=1000, memory_mib=1024, gpus=1),))
    for gang in (_one_gpu(), pair):
        first = engine.place(tracked, gang, CONFIG)
        tracked.apply(gang, first.slots)
        again = engine.place(tracked, replace(gang, name=gang.name + "-2"), CONFIG)
        assert (first.fleet_scan, again.fleet_scan) == (True, False), gang.name
    renewed = TrackedSnapshot(tracked.copy().nodes, tracked.kueue_topologies)
    placement = engine.place(renewed, _one_gpu(), CONFIG)
    assert placement.fleet_scan is True, "a renewed snapshot keeps none of the old facts"
    assert _answer(placement) == _answer(CpSatEngine(seed=0).place(renewed.copy(), _one_gpu(),
                                                                   CONFIG))
