"""The degraded mode on a fake clock over `FakeApi`: a follower that cannot take an
expired Lease counts the time nobody leads and, past the limit, marks our AdmissionCheck
Active=False with the reason, even though its writes are otherwise guarded; a leader's
next pass writes Active=True back. (e2e/tests/test_outage.py does it on the real plane.)"""

from __future__ import annotations

import asyncio
from typing import Any

from nexus_admit.controller.api import ApiException
from nexus_admit.controller.check_config import sync_checks
from nexus_admit.controller.context import Context
from nexus_admit.controller.degraded import NO_LEADER_REASON, mark_no_leader
from nexus_admit.controller.options import RunOptions
from nexus_admit.kube import labels as L
from tests.controller.fake_api import FakeApi
from tests.controller.runtime.test_lease import Clock, replica

CHECK = {
    "kind": "AdmissionCheck",
    "metadata": {"name": "nexus-placement"},
    "spec": {"controllerName": L.ADMISSION_CHECK_CONTROLLER},
    "status": {"conditions": [{"type": "Active", "status": "True", "reason": "Ready"}]},
}
FOREIGN = {
    "kind": "AdmissionCheck",
    "metadata": {"name": "provisioning"},
    "spec": {"controllerName": "kueue.x-k8s.io/provisioning-request"},
}


class RefusingLeaseWrites(FakeApi):
    def write_lease(self, body: Any, *, create: bool) -> dict[str, Any]:
        raise ApiException(status=403, reason="lease writes refused")


def active(api: FakeApi, name: str = "nexus-placement") -> dict[str, Any]:
    check = api.get("AdmissionCheck", name)
    assert check is not None
    (cond,) = [c for c in check.get("status", {}).get("conditions", []) if c["type"] == "Active"]
    return dict(cond)


def test_leaderless_time_counts_from_the_lease_expiry_and_only_while_nobody_leads() -> None:
    api, clock = FakeApi(), Clock()
    a = replica(api, "a", clock)
    a.try_acquire_or_renew()
    b = replica(api, "b", clock)
    assert b.try_acquire_or_renew() is False  # a holds it
    assert a.leaderless_seconds() == 0.0 and b.leaderless_seconds() == 0.0
    clock.now += 14  # a died at 1000; its lease lasts 15 s
    assert b.leaderless_seconds() == 0.0
    clock.now += 16
    assert b.leaderless_seconds() == 15.0


def test_a_follower_that_cannot_take_the_lease_marks_the_check_inactive_once() -> None:
    api, clock = RefusingLeaseWrites(), Clock()
    api.put(
        {
            "kind": "Lease",
            "metadata": {"name": "nexus-admit", "namespace": "nexus-system"},
            "spec": {"holderIdentity": "dead-replica", "leaseDurationSeconds": 15},
        }
    )
    api.put(CHECK)
    api.put(FOREIGN)
    follower = replica(api, "b", clock)
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=None)  # type: ignore[arg-type]
    ctx.api.write_guard = follower.leading  # type: ignore[attr-defined]
    for obj in (CHECK, FOREIGN):
        ctx.store.upsert("AdmissionCheck", api.get("AdmissionCheck", obj["metadata"]["name"]))
    follower.try_acquire_or_renew()
    clock.now += 15 + 60
    assert not follower.try_acquire_or_renew()
    assert follower.leaderless_seconds() >= 60
    assert asyncio.run(mark_no_leader(ctx, follower, follower.leaderless_seconds())) == 1
    cond = active(api)
    assert (cond["status"], cond["reason"]) == ("False", NO_LEADER_REASON)
    assert "no nexus-admit replica has led for 60 s" in cond["message"]
    assert "dead-replica" in cond["message"] and "nexus-admit release" in cond["message"]
    assert "status" not in (api.get("AdmissionCheck", "provisioning") or {})
    # once marked (as the watch shows it), it is not written again every round
    ctx.store.upsert("AdmissionCheck", api.get("AdmissionCheck", "nexus-placement"))
    assert asyncio.run(mark_no_leader(ctx, follower, 80)) == 0


def test_a_leaders_pass_writes_active_true_back() -> None:
    api = FakeApi()
    marked = {
        **CHECK,
        "status": {
            "conditions": [{"type": "Active", "status": "False", "reason": NO_LEADER_REASON}]
        },
    }
    api.put(marked)
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=None)  # type: ignore[arg-type]
    ctx.store.upsert("AdmissionCheck", api.get("AdmissionCheck", "nexus-placement"))
    asyncio.run(sync_checks(ctx))
    assert active(api)["status"] == "True"


def test_a_replica_back_from_a_pause_rereads_the_lease_before_judging() -> None:
    """A replica frozen past the lease (SIGSTOP, a long pause) last saw the old holder; on
    waking, its stale view says nobody has led for a long time, while another replica
    took the Lease and renews it. A fresh read says so (e2e/tests/test_fencing.py met it)."""
    api, clock = FakeApi(), Clock()
    a = replica(api, "a", clock)
    a.try_acquire_or_renew()
    b = replica(api, "b", clock)
    assert b.try_acquire_or_renew() is False
    clock.now += 60  # b frozen meanwhile: a died at once, c took the Lease and renews it
    c = replica(api, "c", clock)
    c.try_acquire_or_renew()  # first sight of a's record: c waits one lease duration
    clock.now += 16
    assert c.try_acquire_or_renew() is True
    assert b.leaderless_seconds() == 61.0  # b's stale view: a's lease ran out at 15 s
    assert b.refresh() == 0.0  # read again: c leads
