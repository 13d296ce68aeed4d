"""Pristine cliques and free GPUs per domain kept from a TrackedSnapshot's change log
(live_facts.py) equal the full count, in the same order; a plain snapshot keeps nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nexus_admit.model import GPU_WHOLE, ClusterSnapshot, Domain, Gang, Node, PodSet, Slot
from nexus_admit.placement.live_facts import live_domain_free, live_pristine_cliques
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.tracking import TrackedSnapshot
from tests.strategies import BLOCK, CONFIG, RACK

GANG = Gang("ns/one", (PodSet("main", 1, 1000, 1024, gpus=1),), tier="gold")


def _node(i: int, rack: str, clique: str | None) -> Node:
    return Node(name=f"n{i}", labels={BLOCK: "b0", RACK: rack}, taints=(), cpu_milli=64_000,
                memory_mib=262_144, max_pods=16, gpu_product="NVIDIA-H100-80GB-HBM3",
                gpu_memory_mib=81559, gpu_free=[GPU_WHOLE] * 8, free_cpu_milli=64_000,
                free_memory_mib=262_144, free_pods=16, clique=clique)


def _fresh(tracked: TrackedSnapshot) -> tuple[dict[str, list[str]], list[dict[Domain, int]]]:
    problem = prepare(tracked.copy(), GANG, CONFIG)  # a plain copy: counted over every node
    free = [dict(problem.domain_free_gpu_milli(li)) for li in range(len(problem.levels) - 1)]
    return problem.pristine_cliques, free


@given(
    st.lists(st.tuples(st.sampled_from(("r0", "r1", "r2")), st.sampled_from((None, "c0", "c1"))),
             min_size=1, max_size=10),
    st.lists(st.tuples(st.integers(0, 9), st.integers(0, 7), st.booleans()), max_size=12),
)
def test_kept_facts_equal_the_full_count_after_every_change(
    layout: list[tuple[str, str | None]], changes: list[tuple[int, int, bool]]
) -> None:
    tracked = TrackedSnapshot.of(_node(i, rack, clique) for i, (rack, clique) in enumerate(layout))
    for which, gpu, take in changes:
        name = f"n{which % len(layout)}"
        slot = Slot("main", 0, name, (gpu,), None)
        if take and tracked.nodes[name].gpu_free[gpu] == GPU_WHOLE:
            tracked.apply(GANG, [slot])
        elif not take and tracked.nodes[name].gpu_free[gpu] == 0:
            tracked.release(GANG, [slot])
        problem = prepare(tracked, GANG, CONFIG)
        cliques, free = _fresh(tracked)
        assert list(problem.pristine_cliques.items()) == list(cliques.items())
        for li, expected in enumerate(free):
            assert list(problem.domain_free_gpu_milli(li).items()) == list(expected.items())


def test_a_plain_snapshot_keeps_nothing() -> None:
    plain = ClusterSnapshot.of([_node(0, "r0", "c0")])
    assert live_pristine_cliques(plain) is None
    problem = prepare(plain, GANG, CONFIG)
    assert live_domain_free(plain, problem.paths, problem.levels, 0) is None
    assert not [k for k in plain.static_cache if isinstance(k, tuple) and "live" in str(k[0])]
