"""openb loaders, the inflation protocol, the fragmentation measure and the paper baselines
on hand-built cases. Small inputs only; nothing is timed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from nexus_admit.model import GPU_WHOLE, Gang, Node, PlacementConfig, PodSet, Slot
from nexus_admit.placement.baselines.fgd import FgdPolicy
from nexus_admit.placement.fragmentation import (
    PodShape,
    TypicalPod,
    WorkloadDistribution,
    gradient_table,
    node_fragmentation,
)
from nexus_admit.placement.policies import make_policy
from nexus_admit.placement.tracking import TrackedSnapshot
from nexus_admit.sim import openb
from nexus_admit.sim.data import csv_path, packaged_data
from nexus_admit.sim.openb import OpenbPod, gpu_request, inflate

DATA = packaged_data()


def node(name: str, free: list[int], cpu: int = 64_000, model: str = "G2") -> Node:
    return Node(name=name, labels={openb.GPU_PRODUCT_LABEL: model}, cpu_milli=64_000,
                memory_mib=262_144, gpu_product=model, gpu_free=list(free),
                free_cpu_milli=cpu, free_memory_mib=262_144)


def one(cpu: int = 1000, gpus: int = 1, milli: int = GPU_WHOLE, name: str = "p") -> Gang:
    return Gang(name, (PodSet("main", 1, cpu_milli=cpu, memory_mib=1024, gpus=gpus,
                              gpu_milli=milli),))


def dist(*items: tuple[PodShape, float]) -> WorkloadDistribution:
    return WorkloadDistribution(tuple(TypicalPod(s, p) for s, p in items))


# ---------------------------------------------------------------- loaders


def test_loaders_match_the_data_readme() -> None:
    nodes = openb.load_nodes(DATA)
    assert len(nodes) == 1213
    assert sum(n.gpu_count for n in nodes) == 6212
    assert len(openb.load_pods("default", DATA)) == 8152
    assert len(openb.load_pods("multigpu50", DATA)) == 9061
    spec = openb.load_pods("gpuspec33", DATA)
    assert len(spec) == 8152
    assert any(len(p.gpu_spec) == 2 for p in spec)  # "V100M16|V100M32"
    assert all(p.gpu_milli == GPU_WHOLE for p in spec if p.num_gpu > 1)


def test_unknown_trace_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown openb trace"):
        openb.load_pods("nope", DATA)


NODES_CSV = """sn,cpu_milli,memory_mib,gpu,model,site
n0,96000,393216,8,V100M32,x
n1,96000,393216,8,V100M32,x
n2,64000,262144,2,T4,y
n3,32000,131072,0,,y
"""
PODS_CSV = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos
a,4000,8192,1,500,,LS
b,8000,16384,2,1000,V100M32,BE
c,2000,4096,0,0,,LS
d,6000,8192,1,1000,T4|V100M32,LS
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_users_own_lists_run_through_the_protocol(tmp_path: Path) -> None:
    nodes = openb.read_nodes(write(tmp_path / "nodes.csv", NODES_CSV))
    assert [(n.name, n.gpu_count, n.gpu_product) for n in nodes] == [
        ("n0", 8, "V100M32"), ("n1", 8, "V100M32"), ("n2", 2, "T4"), ("n3", 0, "")]
    pods_file = write(tmp_path / "pods.csv", PODS_CSV)
    assert openb.read_pods(pods_file) == (
        OpenbPod("a", 4000, 8192, 1, 500), OpenbPod("b", 8000, 16384, 2, 1000, ("V100M32",)),
        OpenbPod("c", 2000, 4096, 0, 0), OpenbPod("d", 6000, 8192, 1, 1000, ("T4", "V100M32")))
    run = openb.run_openb("mine", "fgd", 42, pods_file=pods_file,
                          nodes_file=tmp_path / "nodes.csv")
    assert run.trace == "mine" and run.capacity_milli == 18 * GPU_WHOLE
    assert run.pods > 4  # inflated to 1.3 x the 18 GPUs
    assert 0 < run.alloc_100 <= 100 and run.nodes8 == 2


def test_the_bundled_lists_given_as_own_files_give_the_same_run() -> None:
    own = openb.run_openb("mine", "fgd", 42, node_fraction=0.05, limit=300,
                          pods_file=csv_path(DATA, openb.pod_list("default")),
                          nodes_file=csv_path(DATA, openb.NODE_LIST))
    bundled = openb.run_openb("default", "fgd", 42, DATA, node_fraction=0.05, limit=300)
    assert (own.curve_alloc, own.failed) == (bundled.curve_alloc, bundled.failed)


@pytest.mark.parametrize(("row", "message"), [
    ("e,4x,8192,1,500,,LS", "pods.csv:6: column cpu_milli: '4x' is not a whole number"),
    ("e,4000,8192,1,1500,,LS", "pods.csv:6: column gpu_milli: 1500 is out of range (0 to 1000)"),
    ("e,4000,-1,1,500,,LS", "pods.csv:6: column memory_mib: -1 is out of range (>= 0)"),
    ("e,4000,8192,2,500,,LS", "pods.csv:6: column gpu_milli: a share of a GPU (500) needs"),
    ("e,4000,8192,1,0,,LS", "pods.csv:6: column gpu_milli: 0 for a pod with num_gpu 1"),
    (",4000,8192,1,500,,LS", "pods.csv:6: column name is empty"),
    ("e,4000,8192", "pods.csv:6: column num_gpu: None is not a whole number"),
])
def test_a_malformed_pod_row_names_the_file_line_and_column(tmp_path: Path, row: str,
                                                            message: str) -> None:
    path = write(tmp_path / "pods.csv", PODS_CSV + row + "\n")
    with pytest.raises(openb.TraceError, match=re.escape(message)):
        openb.read_pods(path)


@pytest.mark.parametrize(("row", "message"), [
    ("n1,96000,393216,8,A100", "nodes.csv:6: column sn: node 'n1' is listed twice"),
    ("n9,96000,393216,eight,A100", "nodes.csv:6: column gpu: 'eight' is not a whole number"),
    ("n9,96000,393216,8,", "nodes.csv:6: column model is empty for a node with 8 GPUs"),
])
def test_a_malformed_node_row_names_the_file_line_and_column(tmp_path: Path, row: str,
                                                             message: str) -> None:
    path = write(tmp_path / "nodes.csv", NODES_CSV + row + "\n")
    with pytest.raises(openb.TraceError, match=re.escape(message)):
        openb.read_nodes(path)


def test_a_missing_column_or_no_gpu_at_all_is_named(tmp_path: Path) -> None:
    no_milli = write(tmp_path / "p.csv", "name,cpu_milli,memory_mib,num_gpu\na,1,1,1\n")
    with pytest.raises(openb.TraceError, match=re.escape(
            "p.csv:1: missing column(s) gpu_milli (wants name, cpu_milli, memory_mib, num_gpu, "
            "gpu_milli)")):
        openb.read_pods(no_milli)
    with pytest.raises(openb.TraceError, match=re.escape("n.csv:1: missing column(s) sn, model")):
        openb.read_nodes(write(tmp_path / "n.csv", "name,cpu_milli,memory_mib,gpu\n"))
    cpu_only = write(tmp_path / "cpu.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                                           "a,1000,1024,0,0\n")
    with pytest.raises(openb.TraceError, match=re.escape("cpu.csv: no pod requests a GPU")):
        openb.read_pods(cpu_only)  # the inflation would never end


# ---------------------------------------------------------------- protocol


def _pods(n: int) -> list[OpenbPod]:
    return [OpenbPod(f"p{i}", 1000, 1024, 1 if i % 3 else 0, 500 if i % 2 else GPU_WHOLE)
            for i in range(n)]


def test_inflation_reaches_ratio_without_overshooting() -> None:
    pods = _pods(30)
    capacity = 40 * GPU_WHOLE
    out = inflate(pods, capacity, 1.3, seed=42)
    total = sum(gpu_request(p) for p in out)
    assert total <= 1.3 * capacity
    assert total > 1.3 * capacity - GPU_WHOLE
    for p in pods:  # every original pod is still there (only appended to)
        assert p in out
    assert out == inflate(pods, capacity, 1.3, seed=42)  # deterministic
    assert out != inflate(pods, capacity, 1.3, seed=43)  # shuffled by the seed


def test_inflation_drops_pods_when_the_list_is_too_big() -> None:
    pods = _pods(300)
    out = inflate(pods, 10 * GPU_WHOLE, 1.3, seed=1)
    assert sum(gpu_request(p) for p in out) <= 13 * GPU_WHOLE
    assert set(out) <= set(pods)


def test_allocation_reading_uses_pods_whose_arrival_rounds_to_the_level() -> None:
    arrived = np.array([98.0, 99.6, 100.2, 100.4, 101.0])
    alloc = np.array([90.0, 91.0, 92.0, 94.0, 95.0])
    assert openb.allocation_at(arrived, alloc, 100) == pytest.approx(np.mean([91, 92, 94]))


# ---------------------------------------------------------------- fragmentation


def test_fragmentation_hand_computed() -> None:
    d = dist((PodShape(0, GPU_WHOLE, 1), 0.5), (PodShape(0, 600, 1), 0.5))
    gpu = np.array([[1000, 500, 0], [500, 500, 0]])
    cpu = np.array([10_000, 10_000])
    access = d.access_matrix(["G2", "G2"])
    f = node_fragmentation(gpu, cpu, access, d)
    # node 0: both shapes fit; the 500 share is below both requests -> 500 each
    # node 1: neither fits -> all 1000 idle counts for both
    assert f.tolist() == [500.0, 1000.0]


def test_fragmentation_counts_everything_when_cpu_model_or_kind_rule_it_out() -> None:
    gpu = np.array([[1000, 1000]])
    cpu_pod = dist((PodShape(4000, 0, 0), 1.0))
    assert node_fragmentation(gpu, np.array([64_000]), cpu_pod.access_matrix(["G2"]),
                              cpu_pod).tolist() == [2000.0]
    needs_cpu = dist((PodShape(8000, GPU_WHOLE, 1), 1.0))
    assert node_fragmentation(gpu, np.array([4000]), needs_cpu.access_matrix(["G2"]),
                              needs_cpu).tolist() == [2000.0]
    t4_only = dist((PodShape(0, GPU_WHOLE, 1, ("T4",)), 1.0))
    assert node_fragmentation(gpu, np.array([4000]), t4_only.access_matrix(["G2"]),
                              t4_only).tolist() == [2000.0]
    assert node_fragmentation(gpu, np.array([4000]), t4_only.access_matrix(["T4"]),
                              t4_only).tolist() == [0.0]


def test_typical_pods_cover_the_threshold_and_renormalise() -> None:
    shapes = [PodShape(1, 1000, 1)] * 6 + [PodShape(2, 500, 1)] * 3 + [PodShape(3, 0, 0)]
    d = WorkloadDistribution.from_shapes(shapes, coverage=0.85)
    assert [tp.shape.cpu_milli for tp in d.pods] == [1, 2]
    assert sum(tp.popularity for tp in d.pods) == pytest.approx(1.0)
    assert d.pods[0].popularity == pytest.approx(6 / 9)


def test_gradient_table_prefers_the_gpu_that_keeps_a_whole_one() -> None:
    d = dist((PodShape(0, GPU_WHOLE, 1), 1.0))
    # a 300 share on [1000, 300]: best is the 300 GPU -> fragmentation drops by 300
    assert gradient_table([1000, 300], 8000, "G2", 0, 1, 300, 1, d) == [0.0, -300.0]
    # second pod no longer fits on the small GPU, goes to the whole one
    table = gradient_table([1000, 300], 8000, "G2", 0, 1, 300, 2, d)
    assert table[2] == pytest.approx(700.0 - 300.0)


def test_cluster_counts_used_and_partly_idle_8_gpu_nodes() -> None:
    snap = TrackedSnapshot.of([node("whole", [GPU_WHOLE] * 8), node("partly", [GPU_WHOLE] * 8),
                               node("free", [GPU_WHOLE] * 8), node("small", [GPU_WHOLE] * 2)])
    snap.apply(one(gpus=8), [Slot("main", 0, "whole", tuple(range(8)))])
    snap.apply(one(), [Slot("main", 0, "partly", (0,))])
    snap.apply(one(), [Slot("main", 0, "small", (0,))])
    _, idle, used8, partly8 = openb.cluster_fragmentation(snap, dist((PodShape(0, 1000, 1), 1.0)))
    assert idle == (7 + 8 + 1) * GPU_WHOLE
    assert (used8, partly8) == (2, 1)  # the node filled whole is used, not left partly idle


# ---------------------------------------------------------------- baselines


def snap(*nodes: Node) -> TrackedSnapshot:
    return TrackedSnapshot.of(nodes)


def place(policy: str, s: TrackedSnapshot, gang: Gang, seed: int = 0):  # type: ignore[no-untyped-def]
    p = make_policy(policy, seed)
    placement = p.place(s, gang, PlacementConfig())
    assert placement.feasible, placement.reason
    return placement.slots[0]


def test_bestfit_takes_the_tightest_node() -> None:
    s = snap(node("a", [1000, 1000]), node("b", [0, 1000]))
    assert place("paper-bestfit", s, one()).node == "b"


def test_gpu_packing_prefers_a_partly_used_gpu_then_a_used_node() -> None:
    s = snap(node("idle", [1000, 1000]), node("part", [400, 1000]), node("used", [0, 1000]))
    slot = place("gpu-packing", s, one(milli=300))
    assert (slot.node, slot.gpu_indices) == ("part", (0,))
    s = snap(node("idle", [1000, 1000]), node("used", [0, 1000]))
    assert place("gpu-packing", s, one()).node == "used"


def test_dotprod_prefers_the_smaller_dot_product() -> None:
    s = snap(node("big", [1000] * 4, cpu=64_000), node("small", [1000], cpu=8000))
    assert place("dotprod", s, one()).node == "small"


def test_gpu_clustering_puts_the_same_kind_together() -> None:
    s = snap(node("a", [1000] * 4), node("b", [1000] * 4))
    policy = make_policy("gpu-clustering", 0)
    cfg = PlacementConfig()
    first = policy.place(s, one(milli=250, name="x"), cfg)
    s.apply(one(milli=250, name="x"), first.slots)
    second = policy.place(s, one(milli=250, name="y"), cfg)
    assert second.slots[0].node == first.slots[0].node
    # a whole-GPU pod avoids the node holding only shared pods
    third = policy.place(s, one(name="z"), cfg)
    assert third.slots[0].node != first.slots[0].node


def test_fgd_keeps_whole_gpus_whole() -> None:
    s = snap(node("a", [1000, 1000]), node("b", [1000, 300]))
    policy = FgdPolicy(0, dist((PodShape(0, GPU_WHOLE, 1), 1.0)))
    placement = policy.place(s, one(milli=300), PlacementConfig())
    assert (placement.slots[0].node, placement.slots[0].gpu_indices) == ("b", (1,))


def test_random_only_uses_feasible_nodes() -> None:
    s = snap(node("full", [0, 0]), node("cpu-starved", [1000], cpu=10), node("ok", [1000]))
    for seed in range(10):
        assert place("paper-random", s, one(cpu=500), seed).node == "ok"


@pytest.mark.parametrize("policy", ["paper-random", "dotprod", "gpu-clustering",
                                    "gpu-packing", "paper-bestfit", "fgd"])
def test_policies_never_overbook_and_respect_gpu_models(policy: str) -> None:
    rng = np.random.default_rng(7)
    nodes = [node(f"n{i}", [1000] * int(rng.choice([1, 2, 4, 8])),
                  model="T4" if i % 3 == 0 else "G2") for i in range(12)]
    s = snap(*nodes)
    p = make_policy(policy, 1)
    cfg = PlacementConfig()
    for k in range(120):
        gpus = int(rng.choice([0, 1, 1, 2]))
        milli = int(rng.choice([250, 500, 1000])) if gpus == 1 else GPU_WHOLE
        spec = ("T4",) if k % 5 == 0 else ()
        pod = OpenbPod(f"p{k}", int(rng.integers(500, 8000)), 1024, gpus, milli, spec)
        gang = Gang(pod.name, (openb.pod_set(pod),))
        placement = p.place(s, gang, cfg)
        if placement.feasible:
            if spec:
                assert s.nodes[placement.slots[0].node].gpu_product == "T4"
            s.apply(gang, placement.slots)
    for n in s:
        assert all(0 <= g <= GPU_WHOLE for g in n.gpu_free)
        assert n.free_cpu_milli >= 0 and n.free_memory_mib >= 0


# ---------------------------------------------------------------- runs and report


def test_small_run_conserves_gpus_and_writes_a_report(tmp_path: Path) -> None:
    from nexus_admit.sim.openb_report import write_openb_report
    from nexus_admit.sim.study import summarise

    runs = [openb.run_openb("default", p, 42, DATA, node_fraction=0.05, limit=400)
            for p in ("paper-bestfit", "fgd")]
    for r in runs:
        assert r.pods == 400
        assert 0 <= r.failed < r.pods
        assert all(0 <= a <= 100 for a in r.curve_alloc)
        assert r.curve_alloc == sorted(r.curve_alloc)  # pods never leave
        assert all(p <= b for p, b in zip(r.curve_partial8, r.curve_broken8, strict=True))
    rows = summarise(runs)
    path = write_openb_report(rows, runs, tmp_path, {"runs": 2, "traces": ["default"]})
    assert path.exists()
    assert (tmp_path / "openb_default.png").stat().st_size > 10_000
    payload = json.loads((tmp_path / "openb.json").read_text())
    assert {r["policy"] for r in payload["table"]} == {"paper-bestfit", "fgd"}
