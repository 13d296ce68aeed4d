"""The per-snapshot facts derived in one pass over the nodes (node_kinds.py, and the GPU
columns, pod capacities and candidate positions of columns.py) against what each node
says of itself, and the static filter by kind against the filter node by node on fleets
with what the kinds split on: cordoned nodes, taints, missing labels, NVLink cliques (one
named ""), GPU-less nodes, ComputeDomain pod sets and required levels."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from nexus_admit.model import (
    GPU_WHOLE,
    NVLINK_CLIQUE_LEVEL,
    ClusterSnapshot,
    Gang,
    Node,
    NumaPolicy,
    PodSet,
    Taint,
    Toleration,
    pod_capacity,
    with_clique_level,
)
from nexus_admit.placement.columns import gpu_columns, pod_capacities, positions_of
from nexus_admit.placement.node_kinds import clique_codes, dense_codes, node_kinds
from nexus_admit.placement.problem import _filter_nodes, prepare
from tests.strategies import BLOCK, CONFIG, LEVELS, PRODUCTS, RACK


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


@settings(max_examples=200, deadline=None)
@given(fleet=mixed_fleets(), data=st.data())
def test_the_gpu_columns_are_each_nodes_free_share_and_whole_gpus(
    fleet: list[Node], data: st.DataObject
) -> None:
    """On the snapshot, then on a copy (sharing its static cache) after GPUs were taken,
    and after a node's GPU count changed under the kept cache."""
    snapshot = ClusterSnapshot.of(fleet)
    copy = snapshot.copy()
    for node in copy:
        node.gpu_free = [data.draw(st.sampled_from((GPU_WHOLE, 0, 500))) for _ in node.gpu_free]
    for snap in (snapshot, copy):
        node_kinds(snap)
        gpus = gpu_columns(snap)
        assert gpus.free.tolist() == [n.free_gpu_milli for n in snap]
        assert gpus.whole.tolist() == [n.free_whole_gpus for n in snap]
        assert gpus.pristine().tolist() == [n.is_pristine() for n in snap]
    if fleet:
        changed = data.draw(st.sampled_from(list(copy.nodes)))
        copy.nodes[changed].gpu_free = [GPU_WHOLE] * data.draw(st.integers(0, 9))
        gpus = gpu_columns(copy)
        assert gpus.free.tolist() == [n.free_gpu_milli for n in copy]
        assert gpus.whole.tolist() == [n.free_whole_gpus for n in copy]
        assert gpus.count.tolist() == [n.gpu_count for n in copy]


def _pod_set(gpus: int, clique: bool, tolerates: bool) -> PodSet:
    return PodSet("ps", 1, cpu_milli=8000, gpus=gpus, vram_mib=45_000 if gpus else 0,
                  compute_domain="ns/cd-channel" if clique else None,
                  tolerations=(Toleration("dedicated", "Exists"),) if tolerates else ())


@settings(max_examples=300, deadline=None)
@given(fleet=mixed_fleets(), gpus=st.sampled_from((0, 1, 8)), clique=st.booleans(),
       tolerates=st.booleans(), level=st.sampled_from((None, BLOCK, RACK, NVLINK_CLIQUE_LEVEL)),
       tier=st.sampled_from(("gold", "silver", "bronze")))
def test_the_filter_by_kind_rules_as_node_by_node_and_keeps_where_it_found_them(
    fleet: list[Node], gpus: int, clique: bool, tolerates: bool, level: str | None, tier: str
) -> None:
    snapshot = ClusterSnapshot.of(fleet)
    if clique and level is None:  # a ComputeDomain needs a required level
        level = NVLINK_CLIQUE_LEVEL
    if not clique and level == NVLINK_CLIQUE_LEVEL:  # a level only a ComputeDomain adds
        level = None
    ps = replace(_pod_set(gpus, clique, tolerates), required_level=level)
    problem = prepare(snapshot, Gang("ns/g", (ps,), tier=tier), CONFIG)
    levels = with_clique_level(LEVELS, clique)
    assert problem.levels == levels
    req = levels.index(level) if level is not None else None
    allowed = CONFIG.allowed_classes(tier) if gpus else None
    named = replace(ps, allowed_nodes=frozenset(snapshot.nodes))
    by_kind = _filter_nodes(snapshot, ps, problem.paths, problem.node_class, levels, req,
                            allowed)
    one_by_one = _filter_nodes(snapshot, named, problem.paths, problem.node_class, levels,
                               req, allowed)
    assert by_kind[0] == one_by_one[0]
    assert list(by_kind[1].items()) == list(one_by_one[1].items())
    order = list(snapshot.nodes)
    for names in (by_kind[0], one_by_one[0], list(by_kind[0])):  # the last one looked up
        assert positions_of(snapshot, names).tolist() == [order.index(n) for n in names]


@settings(max_examples=300, deadline=None)
@given(fleet=mixed_fleets(), data=st.data())
def test_the_pod_capacities_on_columns_are_each_nodes_pod_capacity(
    fleet: list[Node], data: st.DataObject
) -> None:
    """Free CPU, memory and pod slots drawn down to none (and below, as an overcommitted
    node reports), pod sets of whole GPUs or none, with and without CPU or memory, every
    NUMA policy; a share per GPU or a strict NUMA zone is left to the nodes (None)."""
    draw = data.draw
    for node in fleet:
        node.free_cpu_milli = draw(st.sampled_from((-1_000, 0, 3_000, 16_000, 64_000)))
        node.free_memory_mib = draw(st.sampled_from((0, 8_192, 262_144)))
        node.free_pods = draw(st.sampled_from((0, 1, 3, 110)))
    snapshot = ClusterSnapshot.of(fleet)
    names = draw(st.lists(st.sampled_from(list(snapshot.nodes)), unique=True)) if fleet else []
    gpus = draw(st.sampled_from((0, 1, 2, 4, 8)))
    ps = PodSet("ps", 3, cpu_milli=draw(st.sampled_from((0, 4_000))),
                memory_mib=draw(st.sampled_from((0, 65_536))), gpus=gpus,
                gpu_milli=draw(st.sampled_from((GPU_WHOLE, 500))) if gpus == 1 else GPU_WHOLE)
    policy = draw(st.sampled_from(list(NumaPolicy)))
    caps = pod_capacities(snapshot, names, gpu_columns(snapshot).whole, ps, policy)
    if ps.fractional or policy is NumaPolicy.SINGLE_NUMA_NODE:
        assert caps is None
    else:
        assert caps is not None
        assert caps.tolist() == [pod_capacity(snapshot.nodes[n], ps, policy) for n in names]


def test_pod_capacities_past_64_bits_are_left_to_the_nodes() -> None:
    """A malformed dump's free CPU of 10**20 millicores: None (node by node), no overflow."""
    node = Node(name="n0", labels={}, cpu_milli=8000, memory_mib=8192, gpu_product="T4",
                gpu_memory_mib=15_360, gpu_free=[GPU_WHOLE], free_cpu_milli=10**20)
    snapshot = ClusterSnapshot.of([node])
    ps = PodSet("ps", 2, cpu_milli=1000, gpus=1)
    whole = gpu_columns(snapshot).whole
    assert pod_capacities(snapshot, ["n0"], whole, ps, NumaPolicy.PREFERRED) is None


def test_a_node_of_any_vram_label_has_a_kind() -> None:
    """VRAM per GPU comes from a label, which may hold any integer (a malformed dump's
    10**20): kept as a float per kind, exact below 2**53, never an overflow."""
    nodes = [Node(name=f"n{i}", labels={}, cpu_milli=8000, memory_mib=8192, gpu_product="T4",
                  gpu_memory_mib=memory, gpu_free=[GPU_WHOLE])
             for i, memory in enumerate((10**20, 15_360))]
    kinds = node_kinds(ClusterSnapshot.of(nodes))
    assert kinds.vram.tolist() == [1e20, 15_360.0]
