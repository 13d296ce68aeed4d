"""The instant check (the benchmark's floor for any AdmissionCheck): which Workloads it
answers, once per quota reservation, and what it writes."""

from __future__ import annotations

from typing import Any

from bench_e2e import instant_check, queues


def workload(
    state: str = "Pending", *, reserved: str | None = "2026-11-30T10:00:00Z",
    check: str = queues.INSTANT_CHECK, admitted: bool = False,
) -> dict[str, Any]:
    conditions = []
    if reserved:
        conditions.append(
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": reserved}
        )
    if admitted:
        conditions.append({"type": "Admitted", "status": "True"})
    return {
        "metadata": {"name": "wl", "namespace": "bench-check", "uid": "u1"},
        "status": {"conditions": conditions,
                   "admissionChecks": [{"name": check, "state": state}]},
    }


def test_answers_a_workload_waiting_on_its_check_once_per_quota_reservation() -> None:
    first = instant_check.attempt(workload())
    assert first == ("u1", "2026-11-30T10:00:00Z")
    assert instant_check.attempt(workload()) == first  # the same event again: no new answer
    # evicted and reserved again: a new attempt, answered again
    assert instant_check.attempt(workload(reserved="2026-11-30T10:05:00Z")) != first


def test_leaves_what_is_not_waiting_on_it() -> None:
    assert instant_check.attempt(workload("Ready")) is None
    assert instant_check.attempt(workload(reserved=None)) is None  # no quota yet
    assert instant_check.attempt(workload(admitted=True)) is None
    assert instant_check.attempt(workload(check=queues.NEXUS_CHECK)) is None  # nexus's


def test_its_entry_is_ready_and_says_nothing_was_placed() -> None:
    entry = instant_check.ready_entry("2026-11-30T10:00:01Z")
    assert entry["name"] == queues.INSTANT_CHECK and entry["state"] == "Ready"
    assert "nothing placed" in entry["message"]
    assert "podSetUpdates" not in entry


def test_the_instant_queues_are_the_kueue_alone_queues_with_the_instant_check() -> None:
    pools = {p: {"cpu": 64, "memoryGi": 512, "gpus": 8} for p in ("h100", "a100", "l40s")}
    objs = queues.cluster_queues(pools)
    check = objs[0]
    assert check["kind"] == "AdmissionCheck"
    assert check["spec"]["controllerName"] == queues.INSTANT_CONTROLLER
    cqs = {o["metadata"]["name"]: o["spec"] for o in objs[1:]}

    def checks(name: str) -> list[str]:
        strategy = cqs[name].get("admissionChecksStrategy") or {}
        return [c["name"] for c in strategy.get("admissionChecks") or []]

    for tier in ("gold", "silver", "bronze"):
        assert checks(tier) == []
        assert checks(f"nexus-{tier}") == [queues.NEXUS_CHECK]
        assert checks(f"instant-{tier}") == [queues.INSTANT_CHECK]
        # the same flavor and quota as Kueue alone's: only the check differs
        assert cqs[f"instant-{tier}"]["resourceGroups"] == cqs[tier]["resourceGroups"]
