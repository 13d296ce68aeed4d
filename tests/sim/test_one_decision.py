"""The controller's pass and the replay decide through the same `placement.decide`: one
scenario (the same nodes, the same gangs in the same order, the same PlacementConfig)
driven through both gives the same Decision sequence."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_admit.controller.loop import place as controller_place
from nexus_admit.controller.store import WATCHED_KINDS
from nexus_admit.kube import labels as L
from nexus_admit.model import Node, PlacementConfig
from nexus_admit.placement import decide as decide_module
from nexus_admit.placement.decide import Capacity, Decision, DecisionRequest
from nexus_admit.sim import replay_run
from nexus_admit.sim.replay_model import AGG_LABEL, TOR_LABEL, Job, ReplayScenario
from tests.controller.fake_api import FakeApi
from tests.controller.test_placing import QR, controller, run
from tests.kube.kube_factories import admission_check, cluster_queue, node, pod_set, workload

# (name, GPUs of its one pod): 6 + 6 leave 2 + 2 free, so the 4-GPU pod waits (Retry)
# while the total still fits Kueue's quota, and the 2-GPU pod behind it is placed
GANGS = (("j1", 6), ("j2", 6), ("j3", 4), ("j4", 2))
FABRIC = {AGG_LABEL: "agg-0", TOR_LABEL: "tor-0"}


def _cluster() -> FakeApi:
    api = FakeApi()
    for n in ("n0", "n1"):
        api.put(node(n, labels=FABRIC))
    api.put(cluster_queue("cq", "gold"))
    api.put(admission_check("nexus"))
    for i, (name, gpus) in enumerate(GANGS):
        w = workload(name, [pod_set(count=1, gpus=gpus, annotations={
            L.ANN_WORKLOAD_TYPE: "inference"})], created=f"2026-11-25T09:00:0{i}Z")
        w["status"]["conditions"][0]["lastTransitionTime"] = QR
        api.put(w)
    return api


def _recording(into: list[tuple[str, str]]) -> Any:
    real = decide_module.decide

    def decide(request: DecisionRequest, capacity: Capacity) -> Decision:
        decision = real(request, capacity)
        into.append((request.gang.name, type(decision).__name__))
        return decision

    return decide


def test_the_controller_and_the_replay_make_the_same_decisions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    api = _cluster()
    ctx, _ = controller(api)
    nodes: list[Node] = list(ctx.store.dump().snapshot().nodes.values())
    config = PlacementConfig()
    assert all(n.labels.get(TOR_LABEL) == "tor-0" for n in nodes)

    in_controller: list[tuple[str, str]] = []
    monkeypatch.setattr(controller_place, "decide", _recording(in_controller))
    run(ctx)

    in_replay: list[tuple[str, str]] = []
    jobs = [Job(f"default/{name}", "gold", "inference", 1, gpus, 1000, 0, 4000, 16384,
                arrival=0.0, duration=1.0) for name, gpus in GANGS]
    monkeypatch.setattr(replay_run, "build_cluster", lambda scn, data: nodes)
    monkeypatch.setattr(replay_run, "generate_jobs", lambda scn, capacity: jobs)
    monkeypatch.setattr(decide_module, "decide", _recording(in_replay))
    replay_run.run_replay("nexus", ReplayScenario(name="parity", hosts=8, jobs=len(jobs)),
                          config=config)

    assert in_controller == [("default/j1", "Place"), ("default/j2", "Place"),
                             ("default/j3", "Retry"), ("default/j4", "Place")]
    # the replay's first cycle is the controller's pass; later cycles retry what waits
    assert in_replay[: len(in_controller)] == in_controller
    assert {kind for name, kind in in_replay if name == "default/j3"} <= {"Retry", "Place"}


def test_both_sides_watch_every_kind_the_decision_reads() -> None:
    # the controller's store lists what the snapshot and the gangs are built from
    assert {"Node", "Pod", "Workload", L.KIND_RESOURCE_RESERVATION} <= set(WATCHED_KINDS)
