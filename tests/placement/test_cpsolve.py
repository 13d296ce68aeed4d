"""Work beside a solve (`CpSatEngine.work_beside_solves`): it runs while CP-SAT solves, the
decision waits for it to end, and it changes nothing of the answer, also when it warms
another shape under another config or fails."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

import pytest

from nexus_admit.model import GPU_WHOLE, Gang, Node, Placement, PodSet
from nexus_admit.placement.base import SolvesBeside
from nexus_admit.placement.engine import CpSatEngine
from nexus_admit.placement.tracking import TrackedSnapshot
from tests.strategies import BLOCK, CONFIG, RACK


def _fleet() -> TrackedSnapshot:
    """6 racks of 4 nodes, free GPUs from 2 to 8: a gang of several pods is a CP-SAT model."""
    return TrackedSnapshot.of(
        Node(name=f"n{i}", labels={BLOCK: f"b{i % 2}", RACK: f"r{i % 6}"}, taints=(),
             cpu_milli=64_000, memory_mib=262_144, max_pods=16,
             gpu_product="NVIDIA-H100-80GB-HBM3", gpu_memory_mib=81559,
             gpu_free=[GPU_WHOLE] * (2 + i % 7) + [0] * (6 - i % 7), free_cpu_milli=64_000,
             free_memory_mib=262_144, free_pods=16)
        for i in range(24)
    )


def _gang() -> Gang:
    return Gang("ns/gang", (PodSet("w", 6, cpu_milli=1000, memory_mib=1024, gpus=2),),
                tier="gold")


def _one_pod(gpus: int) -> Gang:
    return Gang(f"ns/one-{gpus}", (PodSet("main", 1, 1000, 1024, gpus=gpus),), tier="bronze")


def _answer(p: Placement) -> tuple[object, ...]:
    return (p.status, p.objective, [(s.pod_set, s.node, s.gpu_indices) for s in p.slots])


def test_the_work_runs_while_the_solve_does_and_the_decision_waits_for_its_end() -> None:
    engine = CpSatEngine(seed=0)
    assert isinstance(engine, SolvesBeside)
    seen: list[tuple[str, bool]] = []
    ended = threading.Event()

    def work(done: threading.Event) -> None:
        seen.append((threading.current_thread().name, done.is_set()))
        done.wait(10)
        time.sleep(0.05)  # still at it after the solve: the decision waits
        ended.set()

    engine.work_beside_solves(work)
    placement = engine.place(_fleet(), _gang(), CONFIG)
    assert placement.feasible and "CP-SAT" in placement.explanation[-1]
    assert ended.is_set(), "the decision returned before the work ended"
    assert seen and seen[0] == ("beside-solve", False), seen
    engine.work_beside_solves(None)
    seen.clear()
    engine.place(_fleet(), replace(_gang(), name="ns/again"), CONFIG)
    assert seen == [], "no work set: none runs"


def test_a_one_pod_decision_solves_nothing_and_runs_no_work() -> None:
    engine = CpSatEngine(seed=0)
    ran: list[bool] = []
    engine.work_beside_solves(lambda done: ran.append(True))
    assert engine.place(_fleet(), _one_pod(1), CONFIG).feasible
    assert ran == []


def test_warming_another_shape_under_another_config_beside_a_solve_changes_no_answer() -> None:
    """The work warms a one-pod shape under a config with other weights (the node memo is
    synced to it meanwhile); the gang's decision is the one of an engine with no work, and
    the warmed shape's decision then derives nothing over the fleet."""
    snapshot = _fleet()
    other = CONFIG.model_copy(
        update={"weights": CONFIG.weights.model_copy(update={"frag_gradient": 2})})
    engine = CpSatEngine(seed=0)
    warmed: list[bool] = []

    def work(done: threading.Event) -> None:
        warmed.append(engine.warm(snapshot, _one_pod(2), other))

    engine.work_beside_solves(work)
    placement = engine.place(snapshot, _gang(), CONFIG)
    assert warmed == [True]
    assert _answer(placement) == _answer(CpSatEngine(seed=0).place(_fleet(), _gang(), CONFIG))
    engine.work_beside_solves(None)
    one = engine.place(snapshot, _one_pod(2), other)
    assert one.fleet_scan is False, "warmed beside the gang's solve"
    assert _answer(one) == _answer(CpSatEngine(seed=0).place(_fleet(), _one_pod(2), other))


def test_work_that_fails_beside_a_solve_is_logged_and_the_decision_stands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = CpSatEngine(seed=0)

    def work(done: threading.Event) -> None:
        raise RuntimeError("broken warm")

    engine.work_beside_solves(work)
    with caplog.at_level(logging.ERROR, logger="nexus_admit.placement.cpsolve"):
        placement = engine.place(_fleet(), _gang(), CONFIG)
    assert _answer(placement) == _answer(CpSatEngine(seed=0).place(_fleet(), _gang(), CONFIG))
    assert "work beside a solve failed" in caplog.text and "broken warm" in caplog.text
