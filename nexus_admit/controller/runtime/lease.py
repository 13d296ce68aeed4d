"""Leader election on a coordination.k8s.io/v1 Lease, so two replicas can run safely.

Who calls it: `operator.py` runs `LeaseElector.run` as a background task when
`--leader-elect` is on, and gives the KubeApi a write guard that asks `leading()`. Every
replica watches, re-lists and serves the pod webhook; only the leader writes (checks,
reservations, pod patches, Events, the AdmissionCheck's condition).

The rules are client-go's (`tools/leaderelection`), on the local monotonic clock only, so
clock skew between nodes does not matter:

- a Lease held by another identity is taken only after its record (holder, renewTime,
  resourceVersion) has not changed for `leaseDurationSeconds` as *this* process saw it;
- every write is an update with the read resourceVersion: of two replicas racing for an
  expired lease, one gets 409 Conflict and stays a follower;
- the leader renews every `retry` seconds and counts as leader only until `renew_deadline`
  after the start of its last successful renewal. The deadline is shorter than the lease,
  so a leader that cannot renew stops writing before anyone else may take the lease;
- on a clean stop the leader empties the holder, so the next replica takes over at once.

Why not `kubernetes.leaderelection` from the official client: it runs its loop and the
leader's callback in threads with blocking sleeps, decides expiry from the renewTime
written by the other replica (its clock, not ours), and offers no check a write can make
at the moment it is sent. Here the elector is one asyncio task next to kopf, and
`leading()` is a pure function of the monotonic clock that the write guard calls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from nexus_admit.controller.api import ApiException

__all__ = ["LeaseApi", "LeaseConfig", "LeaseElector", "default_identity"]

log = logging.getLogger(__name__)


def default_identity() -> str:
    """hostname_pid: unique per process, and the pod name in a cluster (its hostname)."""
    return f"{socket.gethostname()}_{os.getpid()}"


class LeaseApi(Protocol):
    def get_lease(self, name: str, namespace: str) -> dict[str, Any] | None: ...

    def write_lease(self, body: Mapping[str, Any], *, create: bool) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    name: str
    namespace: str
    identity: str
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_seconds: float = 2.0


def _micro_time(t: datetime) -> str:
    # Lease times are MicroTime: RFC 3339 with microseconds
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    def __init__(
        self,
        api: LeaseApi,
        config: LeaseConfig,
        *,
        on_started: Callable[[], Awaitable[None]] | None = None,
        on_stopped: Callable[[], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self.api = api
        self.config = config
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.clock = clock
        self.wall = wall
        self._renewed_at: float | None = None  # start of our last successful write
        # (holder, renewTime, resourceVersion) last seen: any write changes the version
        self._observed: tuple[str, str, str] | None = None
        self._observed_at = 0.0  # when that record last changed, on our clock
        self._observed_duration = config.lease_seconds  # its leaseDurationSeconds
        self._was_leading = False
        self.holder = ""  # the identity the Lease named at our last read

    # ---- decisions ----
    def leading(self) -> bool:
        """True while our last renewal is younger than the renew deadline."""
        return (
            self._renewed_at is not None
            and self.clock() - self._renewed_at < self.config.renew_deadline_seconds
        )

    def leaderless_seconds(self) -> float:
        """How long no replica has led, as this process saw the Lease: 0 while we lead or
        its holder's last renewal is within its duration; counted from the moment the
        Lease expired (or was released). The degraded mode (`controller/degraded.py`)
        reads it."""
        if self.leading() or self._observed is None:
            return 0.0
        holder = self._observed[0]
        expired_at = self._observed_at + (self._observed_duration if holder else 0.0)
        return max(0.0, self.clock() - expired_at)

    def refresh(self) -> float:
        """Read the Lease again (blocking) and answer `leaderless_seconds` by it: a replica
        that was paused (a frozen process, a long GC) must not judge by a Lease it read
        before the pause. An unreadable Lease changes nothing."""
        c = self.config
        try:
            lease = self.api.get_lease(c.name, c.namespace)
        except Exception as e:
            log.warning("lease %s/%s: cannot read it: %s", c.namespace, c.name, e)
        else:
            if lease is not None:
                self._observe(lease, self.clock())
        return self.leaderless_seconds()

    def _observe(self, lease: Mapping[str, Any], at: float) -> None:
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        version = str((lease.get("metadata") or {}).get("resourceVersion") or "")
        record = (holder, str(spec.get("renewTime") or ""), version)
        if record != self._observed:
            self._observed = record
            self._observed_at = at
        duration = spec.get("leaseDurationSeconds")
        if isinstance(duration, int | float) and not isinstance(duration, bool) and duration > 0:
            self._observed_duration = float(duration)
        self.holder = holder

    def try_acquire_or_renew(self) -> bool:
        """One round (blocking: run it in a thread): read the Lease, then take it, renew
        it, or leave it to its live holder. True when we hold it now."""
        c = self.config
        started = self.clock()
        now = _micro_time(self.wall())
        try:
            lease = self.api.get_lease(c.name, c.namespace)
        except Exception as e:  # an outage: we cannot renew; leading() runs out by itself
            log.warning("lease %s/%s: cannot read it: %s", c.namespace, c.name, e)
            return False
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": c.name, "namespace": c.namespace},
                "spec": self._spec(now, now, transitions=0),
            }
            return self._write(body, create=True, started=started)
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        self._observe(lease, started)
        duration = float(spec.get("leaseDurationSeconds") or c.lease_seconds)
        if holder and holder != c.identity and started < self._observed_at + duration:
            return False  # another replica holds it and has renewed recently
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == c.identity:
            new_spec = self._spec(str(spec.get("acquireTime") or now), now, transitions)
        else:
            new_spec = self._spec(now, now, transitions + 1)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": c.name,
                "namespace": c.namespace,
                # optimistic concurrency: of two replicas taking an expired lease, one wins
                "resourceVersion": (lease.get("metadata") or {}).get("resourceVersion"),
            },
            "spec": new_spec,
        }
        return self._write(body, create=False, started=started)

    def _spec(self, acquired: str, renewed: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.config.identity,
            "leaseDurationSeconds": round(self.config.lease_seconds),
            "acquireTime": acquired,
            "renewTime": renewed,
            "leaseTransitions": transitions,
        }

    def _write(self, body: Mapping[str, Any], *, create: bool, started: float) -> bool:
        c = self.config
        try:
            written = self.api.write_lease(body, create=create)
        except ApiException as e:
            if e.status != 409:  # 409: another replica wrote first; it leads
                log.warning("lease %s/%s: cannot write it: %s", c.namespace, c.name, e.reason)
            return False
        except Exception as e:  # urllib3's own errors in an outage
            log.warning("lease %s/%s: cannot write it: %s", c.namespace, c.name, e)
            return False
        self._renewed_at = started
        self._observe(written or body, started)
        return True

    def release(self) -> bool:
        """Give the Lease up (blocking): stop leading first, then empty its holder so the
        next replica need not wait for it to expire."""
        if self._renewed_at is None:
            return False
        self._renewed_at = None
        c = self.config
        try:
            lease = self.api.get_lease(c.name, c.namespace)
            spec = (lease or {}).get("spec") or {}
            if lease is None or spec.get("holderIdentity") != c.identity:
                return False
            now = _micro_time(self.wall())
            body = {
                **lease,
                "spec": {
                    **spec,
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "renewTime": now,
                },
            }
            self.api.write_lease(body, create=False)
        except Exception as e:  # it expires by itself after leaseDurationSeconds
            log.warning("lease %s/%s: could not release it: %s", c.namespace, c.name, e)
            return False
        log.info("lease %s/%s released by %s", c.namespace, c.name, c.identity)
        return True

    # ---- the task ----
    async def _transition(self) -> None:
        now_leading = self.leading()
        if now_leading == self._was_leading:
            return
        self._was_leading = now_leading
        c = self.config
        if now_leading:
            log.info("became leader: lease %s/%s held by %s", c.namespace, c.name, c.identity)
            if self.on_started is not None:
                await self.on_started()
        else:
            log.warning(
                "stopped leading: lease %s/%s not renewed within %ss (holder now %r)",
                c.namespace,
                c.name,
                c.renew_deadline_seconds,
                self.holder,
            )
            if self.on_stopped is not None:
                await self.on_stopped()

    async def run(self) -> None:
        """Renew or try to take the Lease every `retry` seconds, for ever; on cancel,
        release it if held."""
        c = self.config
        try:
            while True:
                await asyncio.to_thread(self.try_acquire_or_renew)
                await self._transition()
                pause = c.retry_seconds
                if self._renewed_at is not None and self.leading():
                    # wake at the deadline at the latest, to notice a lost lease in time
                    left = self._renewed_at + c.renew_deadline_seconds - self.clock()
                    pause = max(0.0, min(pause, left))
                await asyncio.sleep(pause)
                await self._transition()
        finally:
            if self._renewed_at is not None:
                await asyncio.shield(asyncio.to_thread(self.release))
