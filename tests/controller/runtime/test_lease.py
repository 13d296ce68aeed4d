"""The Lease elector's decisions on a fake clock over `FakeApi` (unit level; the e2e test
e2e/tests/test_leader.py kills a real leader on the real control plane)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client

from nexus_admit.controller.api import KubeApi, NotLeading
from nexus_admit.controller.context import Context
from nexus_admit.controller.loop.cycle import run_loop
from nexus_admit.controller.operator import elect
from nexus_admit.controller.options import OptionsError, RunOptions
from nexus_admit.controller.runtime.lease import LeaseConfig, LeaseElector
from nexus_admit.kube import labels as L
from tests.controller.fake_api import FakeApi
from tests.controller.test_placing import cluster, pending, watch

NS = "nexus-system"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def replica(api: FakeApi, identity: str, clock: Clock) -> LeaseElector:
    return LeaseElector(
        api,
        LeaseConfig("nexus-admit", NS, identity, 15, 10, 2),
        clock=clock,
        wall=lambda: datetime(2026, 11, 25, 10, 0, tzinfo=UTC),
    )


def lease(api: FakeApi) -> dict[str, Any]:
    found = api.get_lease("nexus-admit", NS)
    assert found is not None
    return found


def test_the_first_replica_creates_the_lease_and_the_second_follows() -> None:
    api, clock = FakeApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    assert a.try_acquire_or_renew() and a.leading()
    assert not b.try_acquire_or_renew() and not b.leading()
    assert lease(api)["spec"]["holderIdentity"] == "a"
    assert lease(api)["spec"]["leaseDurationSeconds"] == 15
    assert b.holder == "a"


def test_a_follower_takes_a_dead_leaders_lease_only_after_it_went_unrenewed_for_its_duration() -> (
    None
):
    api, clock = FakeApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()  # b sees a's record at t=1000; a dies now
    for t in (2, 8, 14.9):
        clock.now = 1000 + t
        assert not b.try_acquire_or_renew(), f"taken {t}s after the last renewal"
    clock.now = 1015.1
    assert b.try_acquire_or_renew() and b.leading()
    spec = lease(api)["spec"]
    assert spec["holderIdentity"] == "b"
    assert spec["leaseTransitions"] == 1


def test_a_renewing_leader_keeps_the_lease() -> None:
    api, clock = FakeApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    a.try_acquire_or_renew()
    for _ in range(20):  # 40 s, far past one lease duration
        clock.now += 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    assert a.leading() and not b.leading()
    assert lease(api)["spec"]["leaseTransitions"] == 0


def test_a_leader_that_cannot_renew_stops_before_anyone_may_take_over() -> None:
    api, clock = FakeApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    api.fail[("update", "Lease")] = 100  # a's renewals fail from now on
    clock.now += 9.9
    assert not a.try_acquire_or_renew()
    assert a.leading(), "still within the renew deadline"
    clock.now += 0.2  # 10.1 s after the last renewal
    assert not a.leading()
    assert not b.try_acquire_or_renew(), "the lease (15 s) has not expired for b yet"
    api.fail.clear()
    clock.now += 5
    assert b.try_acquire_or_renew()


def test_two_replicas_racing_for_an_expired_lease_one_wins_on_the_resource_version() -> None:
    api, clock = FakeApi(), Clock()
    dead, b, c = (replica(api, n, clock) for n in ("dead", "b", "c"))
    dead.try_acquire_or_renew()
    b.try_acquire_or_renew()
    c.try_acquire_or_renew()
    clock.now += 16
    stale = lease(api)  # both read this version
    api.get_lease = lambda name, namespace: stale  # type: ignore[method-assign]
    results = [b.try_acquire_or_renew(), c.try_acquire_or_renew()]
    assert results == [True, False]
    assert not c.leading()


def test_release_empties_the_holder_so_a_follower_takes_over_at_once() -> None:
    api, clock = FakeApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    assert a.release()
    assert not a.leading()
    assert lease(api)["spec"]["holderIdentity"] == ""
    clock.now += 2
    assert b.try_acquire_or_renew() and b.leading()


def test_release_never_clears_another_replicas_lease() -> None:
    api, clock = FakeApi(), Clock()
    a, b = replica(api, "a", clock), replica(api, "b", clock)
    a.try_acquire_or_renew()
    clock.now += 16
    b.try_acquire_or_renew()  # first sight of a's record: not expired for b yet
    clock.now += 16
    assert b.try_acquire_or_renew()
    assert not a.release()
    assert lease(api)["spec"]["holderIdentity"] == "b"


def test_an_unreadable_lease_is_no_lease() -> None:
    api, clock = FakeApi(), Clock()
    a = replica(api, "a", clock)
    api.fail[("get", "Lease")] = 1
    assert not a.try_acquire_or_renew() and not a.leading()


def test_a_write_is_refused_before_it_is_sent_when_the_guard_says_no() -> None:
    api = KubeApi(client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    api.write_guard = lambda: False
    with pytest.raises(NotLeading, match="not the leader: did not create Event"):
        api.create("Event", {"metadata": {"name": "x", "namespace": "default"}})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lease_namespace": None}, "needs the Lease's namespace"),
        ({"renew_deadline_seconds": 20.0}, "must stop acting before another replica"),
        ({"lease_retry_seconds": 10.0}, "< --renew-deadline-seconds"),
    ],
)
def test_leader_election_options_that_cannot_work_are_refused(
    overrides: dict[str, Any], message: str
) -> None:
    base = {"webhook": False, "leader_elect": True, "lease_namespace": NS, **overrides}
    with pytest.raises(OptionsError, match=message):
        RunOptions(**base).validate()


def fast_options(identity: str) -> RunOptions:
    return RunOptions(
        webhook=False,
        leader_elect=True,
        lease_namespace=NS,
        leader_identity=identity,
        lease_seconds=0.6,
        renew_deadline_seconds=0.4,
        lease_retry_seconds=0.05,
        tick_seconds=0.1,
    )


async def _two_replicas(api: FakeApi, seconds: float) -> list[Context]:
    from nexus_admit.placement.policies import make_policy

    replicas = []
    tasks = []
    for name in ("a", "b"):
        ctx = Context(options=fast_options(name), api=api, engine=make_policy("nexus"))  # type: ignore[arg-type]
        watch(ctx, api)
        ctx.leadership.synced = True
        elector = elect(ctx)
        replicas.append(ctx)
        tasks += [asyncio.create_task(elector.run()), asyncio.create_task(run_loop(ctx))]
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return replicas


def test_of_two_replicas_only_the_leader_places_and_it_releases_the_lease_on_stop() -> None:
    api = cluster(pending("w1"), pending("w2"))
    a, b = asyncio.run(_two_replicas(api, 1.5))
    placed = {ctx.options.leader_identity: ctx.metrics.placements for ctx in (a, b)}
    total = {
        who: sum(s.value for m in c.collect() for s in m.samples if s.name.endswith("_total"))
        for who, c in placed.items()
    }
    assert sorted(total.values()) == [0, 2], total  # one replica answered both, the other none
    assert len(api.of_kind(L.KIND_RESOURCE_RESERVATION)) == 2
    assert lease(api)["spec"]["holderIdentity"] == "", "released on the way out"


def test_a_guarded_write_gives_up_before_the_lease_could_pass_to_another_replica() -> None:
    """Fencing: a write sent while leading times out within the margin between the renew
    deadline and the Lease's duration, in the client and in the apiserver (its `timeout`
    parameter), so it cannot land under the next leader; reads and the Lease's own writes
    keep the longer timeout."""
    api = KubeApi(None)  # type: ignore[arg-type]
    sent: list[tuple[str, float | None, Any]] = []

    def request(method: str, path: str, **kw: Any) -> dict[str, Any]:
        sent.append((method, kw.get("timeout"), (kw.get("query") or {}).get("timeout")))
        return {}

    api.request = request  # type: ignore[method-assign]
    ctx = Context(options=fast_options("a"), api=api, engine=None)  # type: ignore[arg-type]
    elect(ctx)
    assert api.write_timeout == pytest.approx(0.6 - 0.4)
    api.write_guard = lambda: True  # as while leading
    api.create("Pod", {"metadata": {"name": "p", "namespace": "ns"}})
    api.apply_status("Workload", {"metadata": {"name": "w", "namespace": "ns"}})
    api.get("Pod", "p", "ns")
    assert sent == [
        ("POST", pytest.approx(0.2), "0.2s"),
        ("PATCH", pytest.approx(0.2), "0.2s"),
        ("GET", None, None),
    ]
