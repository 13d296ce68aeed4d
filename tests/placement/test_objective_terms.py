"""Every objective term earns its keep: for each term, a scenario that it alone decides.

Each case turns on one term and a small *counter* preference that wants another answer
(fillOrder, at weight 1, prefers the nodes listed first; for the spreading and the
fillOrder cases tierMismatch plays that part). Every other weight is 0. With the term on,
the placement is the one the term wants; with its weight at 0 the counter decides and the
placement changes. So deleting the term from the engine's model (or breaking its sign or
scale) fails its case, which a scenario that passes on a tie-break would not.

The term-by-term deletion check of issue 18 (each term's contribution multiplied by 0 in
engine.py, one at a time) was done by hand against this module; the results are in the
issue's note.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    Placement,
    PlacementConfig,
    PodSet,
    SolveStatus,
    WorkloadType,
)
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.objective import TERMS, evaluate_terms
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.validate import violations
from tests.factories import A100, H100, L40S, LEVELS, T4, gpu_node, snapshot

# every weight of ObjectiveWeights, camelCase as users write them, all off
_OFF = {
    "tierMismatch": 0,
    "vramStranded": 0,
    "islandBroken": 0,
    "domainSpread": 0,
    "gangSplit": 0,
    "nodeCount": 0,
    "fragmentation": 0,
    "domainFragmentation": 0,
    "numaUnaligned": 0,
    "spread": 0,
    "fragGradient": 0,
    "fillOrder": 0,
}
# the reported term each weight scales (cliques are counted under islandsBroken)
_REPORTED = {
    "tierMismatch": "tierMismatch",
    "vramStranded": "vramStrandedGiB",
    "islandBroken": "islandsBroken",
    "domainSpread": "domainSpread",
    "gangSplit": "gangSplit",
    "nodeCount": "nodesUsed",
    "fragmentation": "fragmentation",
    "domainFragmentation": "domainFragmentation",
    "numaUnaligned": "numaUnaligned",
    "spread": "maxPodsPerNode",
    "fragGradient": "fragGradient",
    "fillOrder": "fillOrder",
    "spreadNode": "spreadPairs",  # PlacementConfig.spread.node (spread.domain stays 0)
}


def _config(weights: dict[str, int]) -> PlacementConfig:
    weights = dict(weights)
    spread = {"node": weights.pop("spreadNode", 0), "domain": 0}
    return PlacementConfig.from_spec(
        {
            "topology": {"levels": list(LEVELS)},
            "solver": {"timeLimitSeconds": 10.0},
            "weights": {**_OFF, **weights},
            "spread": spread,
        }
    )


def _gang(*pod_sets: PodSet, tier: str = "bronze",
          kind: WorkloadType = WorkloadType.TRAINING,
          siblings: dict[str, int] | None = None) -> Gang:
    return Gang("ns/job", pod_sets, tier=tier, workload_type=kind, siblings=siblings or {})


@dataclass(frozen=True)
class Case:
    weight: str  # the ObjectiveWeights field (camelCase) under test
    value: int  # its weight when on
    snap: ClusterSnapshot
    gang: Gang
    wanted: dict[str, int]  # pods per node the term wants
    instead: dict[str, int]  # pods per node the counter preference picks without it
    counter: dict[str, int] = field(default_factory=lambda: {"fillOrder": 1})


def _cases() -> dict[str, Case]:
    one_gpu = PodSet("w", 1, cpu_milli=1000, gpus=1)
    return {
        "tierMismatch": Case(
            "tierMismatch", 10,
            snapshot(gpu_node("a100", gpu=A100), gpu_node("h100", gpu=H100)),
            _gang(one_gpu, tier="gold"),
            wanted={"h100": 1}, instead={"a100": 1},
        ),
        "vramStranded": Case(
            "vramStranded", 1,
            # bronze wants ≥ 70 % of each GPU's VRAM used: 20 GB strands 36 GiB of an
            # 80 GB A100 and 12 GiB of a 45 GB L40S (the same hardware class)
            snapshot(gpu_node("a100", gpu=A100), gpu_node("l40s", gpu=L40S)),
            _gang(PodSet("w", 1, cpu_milli=1000, gpus=1, vram_mib=20_000)),
            wanted={"l40s": 1}, instead={"a100": 1},
        ),
        "islandsBroken": Case(
            "islandBroken", 2000,
            snapshot(gpu_node("pristine"), gpu_node("partly", used=range(4))),
            _gang(one_gpu),
            wanted={"partly": 1}, instead={"pristine": 1},
        ),
        "cliquesBroken": Case(
            "islandBroken", 2000,
            # 4-GPU nodes are not islands on their own (islandMinGpus 8): only the
            # pristine NVLink clique they form is
            snapshot(
                gpu_node("c1", gpus=4, clique="nvl-0"),
                gpu_node("c2", gpus=4, clique="nvl-0"),
                gpu_node("lone", gpus=4),
            ),
            _gang(one_gpu),
            wanted={"lone": 1}, instead={"c1": 1},
        ),
        "numaUnaligned": Case(
            "numaUnaligned", 100,
            # "split" has one free GPU in each NUMA zone, "zone" two in zone 1
            snapshot(
                gpu_node("split", used=[0, 1, 2, 4, 5, 6]),
                gpu_node("zone", used=range(6)),
            ),
            _gang(PodSet("w", 1, cpu_milli=1000, gpus=2)),
            wanted={"zone": 1}, instead={"split": 1},
        ),
        "domainSpread": Case(
            "domainSpread", 400,
            snapshot(
                gpu_node("r0-a", rack="r0"),
                gpu_node("r1-a", rack="r1"),
                gpu_node("r2-a", rack="r2"),
                gpu_node("r2-b", rack="r2"),
            ),
            _gang(PodSet("w", 2, cpu_milli=1000, gpus=8)),
            wanted={"r2-a": 1, "r2-b": 1}, instead={"r0-a": 1, "r1-a": 1},
        ),
        "gangSplit": Case(
            "gangSplit", 400,
            snapshot(
                gpu_node("r0-a", rack="r0"),
                gpu_node("r1-a", rack="r1"),
                gpu_node("r2-a", rack="r2"),
                gpu_node("r2-b", rack="r2"),
            ),
            _gang(PodSet("w", 2, cpu_milli=1000, gpus=8)),
            wanted={"r2-a": 1, "r2-b": 1}, instead={"r0-a": 1, "r1-a": 1},
        ),
        "domainFragmentation": Case(
            "domainFragmentation", 1,
            # BestFit among racks: r1 keeps 1 GPU free after the pod, r0 would keep 15
            snapshot(
                gpu_node("r0-a", rack="r0"),
                gpu_node("r0-b", rack="r0"),
                gpu_node("r1-a", rack="r1", used=range(6)),
            ),
            _gang(one_gpu),
            wanted={"r1-a": 1}, instead={"r0-a": 1},
        ),
        "fragmentation": Case(
            "fragmentation", 20,
            # one rack, so only the node-level idle share tells the nodes apart
            snapshot(gpu_node("empty"), gpu_node("last-gpu", used=range(7))),
            _gang(one_gpu),
            wanted={"last-gpu": 1}, instead={"empty": 1},
        ),
        "nodesUsed": Case(
            "nodeCount", 50,
            snapshot(
                gpu_node("half-a", used=range(4)),
                gpu_node("half-b", used=range(4)),
                gpu_node("whole"),
            ),
            _gang(PodSet("w", 2, cpu_milli=1000, gpus=4)),
            wanted={"whole": 2}, instead={"half-a": 1, "half-b": 1},
        ),
        "maxPodsPerNode": Case(
            "spread", 300,
            # inference spreads; tierMismatch (bronze: T4 free, A100 30/GPU) packs it on T4
            snapshot(gpu_node("t4", gpu=T4), gpu_node("a100", gpu=A100)),
            _gang(PodSet("w", 2, cpu_milli=1000, gpus=1), kind=WorkloadType.INFERENCE),
            wanted={"t4": 1, "a100": 1}, instead={"t4": 2},
            counter={"tierMismatch": 1},
        ),
        "spreadPairs": Case(
            "spreadNode", 1000,
            # a replica already runs on the T4: pairs on one node cost 1000 each (1 with
            # the sibling + 1 within the gang on t4 alone); tierMismatch packs it on T4
            snapshot(gpu_node("t4", gpu=T4), gpu_node("a100", gpu=A100)),
            _gang(PodSet("w", 2, cpu_milli=1000, gpus=1), kind=WorkloadType.INFERENCE,
                  siblings={"t4": 1}),
            wanted={"t4": 1, "a100": 1}, instead={"t4": 2},
            counter={"tierMismatch": 1},
        ),
        "fragGradient": Case(
            "fragGradient", 100,
            # default workload mix: taking a GPU of a whole 8-GPU node denies the 8-GPU
            # shape (popularity 0.15) 7 GPUs; the last GPU of a busy node frees its fragment
            snapshot(gpu_node("empty"), gpu_node("last-gpu", used=range(7))),
            _gang(one_gpu),
            wanted={"last-gpu": 1}, instead={"empty": 1},
        ),
        "fillOrder": Case(
            "fillOrder", 100,
            # fill the first-listed node; tierMismatch (bronze) prefers the T4 listed second
            snapshot(gpu_node("a100", gpu=A100), gpu_node("t4", gpu=T4)),
            _gang(one_gpu),
            wanted={"a100": 1}, instead={"t4": 1},
            counter={"tierMismatch": 1},
        ),
    }


CASES = _cases()


def _place(case: Case, weights: dict[str, int]) -> Placement:
    cfg = _config(weights)
    placement = CpSatEngine(seed=0).place(case.snap, case.gang, cfg)
    assert violations(case.snap, case.gang, placement, cfg) == []
    assert placement.feasible, placement.reason
    assert placement.status is SolveStatus.OPTIMAL
    return placement


def test_every_term_has_a_case() -> None:
    weights = {c.weight for c in CASES.values()}
    assert weights == {*_OFF, "spreadNode"}
    assert {_REPORTED[w] for w in weights} == {*TERMS, "fragGradient", "fillOrder"}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_term_alone_decides_the_placement(case: Case) -> None:
    on = _place(case, {**case.counter, case.weight: case.value})
    off = _place(case, {**case.counter, case.weight: 0})
    assert on.pods_per_node() == case.wanted
    assert off.pods_per_node() == case.instead
    # and it is the term itself that tells them apart: its value is lower where it wins
    term = _REPORTED[case.weight]
    at_zero = off.terms[term] if term in off.terms else _term_at_zero(case, off)
    if case.weight == "spreadNode":  # its per-level weights are inside the term
        problem = prepare(case.snap, case.gang, _config({**case.counter, case.weight: case.value}))
        at_zero = evaluate_terms(problem, off.slots)[term]
    assert on.terms[term] < at_zero


def _term_at_zero(case: Case, off: Placement) -> float:
    """fragGradient and fillOrder are reported only while their weight is on: the value
    the engine's model gives the off placement's slots with the weight on."""
    problem = prepare(case.snap, case.gang, _config({**case.counter, case.weight: case.value}))
    return CpSatEngine(seed=0)._order_values(problem, off.slots)[_REPORTED[case.weight]][0]
