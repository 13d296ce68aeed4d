"""The per-snapshot facts derived in one pass over the nodes (node_kinds.py) against what
each node says of itself, on fleets with what the kinds split on: cordoned nodes, taints,
missing labels, NVLink cliques (one named ""), GPU-less nodes."""

from __future__ import annotations

from collections.abc import Hashable

from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_admit.model import GPU_WHOLE, NVLINK_CLIQUE_LEVEL, ClusterSnapshot, Node, Taint
from nexus_admit.placement.node_kinds import clique_codes, dense_codes, node_kinds
from tests.strategies import BLOCK, PRODUCTS, RACK


@st.composite
def mixed_nodes(draw: st.DrawFn, name: str) -> Node:
    gpus = draw(st.sampled_from((0, 4, 8, 8)))
    product, vram = draw(st.sampled_from(PRODUCTS))
    labels = {}
    for key, values in ((BLOCK, ("b0", "b1")), (RACK, ("r0", "r1", "r2"))):
        if draw(st.integers(0, 5)):  # now and then without it
            labels[key] = draw(st.sampled_from(values))
    clique = draw(st.sampled_from((None, None, "c0", "c1", ""))) if gpus else None
    if clique is not None:
        labels[NVLINK_CLIQUE_LEVEL] = clique
    return Node(
        name=name,
        labels=labels,
        taints=draw(st.sampled_from(((), (), (Taint("dedicated", "infer"),)))),
        cpu_milli=draw(st.sampled_from((16_000, 64_000))),
        memory_mib=262_144,
        gpu_product=product if gpus else "",
        gpu_memory_mib=vram if gpus else 0,
        gpu_free=[draw(st.sampled_from((GPU_WHOLE, GPU_WHOLE, 0, 250))) for _ in range(gpus)],
        clique=clique,
        schedulable=draw(st.integers(0, 5)) > 0,
    )


@st.composite
def mixed_fleets(draw: st.DrawFn) -> list[Node]:
    return [draw(mixed_nodes(f"n{i}")) for i in range(draw(st.integers(0, 12)))]


def _kind_of(node: Node) -> tuple[object, ...]:
    return (node.schedulable, node.taints, node.gpu_memory_mib, node.cpu_milli,
            node.memory_mib, node.gpu_product, len(node.gpu_free))


@settings(max_examples=200, deadline=None)
@given(fleet=mixed_fleets())
def test_node_kinds_group_the_nodes_alike_in_all_they_read(fleet: list[Node]) -> None:
    kinds = node_kinds(ClusterSnapshot.of(fleet))
    assert kinds.names == [n.name for n in fleet]
    assert kinds.gpu_count.tolist() == [len(n.gpu_free) for n in fleet]
    of_node = [_kind_of(n) for n in fleet]
    distinct = list(dict.fromkeys(of_node))  # kinds in order of their first node
    assert kinds.kind.tolist() == [distinct.index(k) for k in of_node]
    assert kinds.first.tolist() == [of_node.index(k) for k in distinct]
    assert kinds.vram.tolist() == [k[2] for k in distinct]


@given(st.lists(st.sampled_from(("a", "b", None, ("a",), 3))), st.booleans())
def test_dense_codes_number_values_in_order_of_first_appearance(
    values: list[Hashable], none_first: bool
) -> None:
    ahead: dict[Hashable, int] | None = {None: 0} if none_first else None
    codes, seen = dense_codes(iter(values), len(values), ahead)
    expected = list(dict.fromkeys([None] if none_first else []) | dict.fromkeys(values))
    assert seen == expected
    assert codes.tolist() == [expected.index(v) for v in values]


@settings(max_examples=200, deadline=None)
@given(fleet=mixed_fleets())
def test_clique_codes_are_each_nodes_clique_with_its_members_in_order(
    fleet: list[Node],
) -> None:
    codes = clique_codes(ClusterSnapshot.of(fleet))
    cliques = list(dict.fromkeys(n.clique for n in fleet if n.clique is not None))
    assert codes.cliques == cliques
    assert codes.index == {c: i for i, c in enumerate(cliques)}
    assert codes.codes.tolist() == [-1 if n.clique is None else cliques.index(n.clique)
                                    for n in fleet]
    assert codes.members == [[n.name for n in fleet if n.clique == c] for c in cliques]
