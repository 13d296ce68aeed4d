"""Test-only crash points: `NEXUS_FAULT=<point>[:<n>]` makes the process die the n-th time
it reaches `<point>` (default the first), with `os._exit(137)`, as a SIGKILL would: no
cleanup, no flushed buffers but the log line before it, no graceful kopf shutdown.

Who calls it: `loop/` and `ungating/ungater.py` call `ctx.faults.hit(<point>)` at the moments a
crash is hardest to recover from; `e2e/tests/test_faults.py` sets the variable and restarts
the controller to prove that every decision is recovered from the cluster's objects. A
timed SIGKILL from outside cannot land on these moments reliably. Unset (production), `hit`
is a comparison and a return.

Points:
  kill-after-solve        a feasible placement is solved, nothing is written yet
  kill-after-reservation  the ResourceReservation is created, the check is not yet Ready
  kill-while-ungating     a gated pod's pin patch is about to go out (it stays gated); the
                          patches started before it may or may not have landed
  hold-fleet-list         not a crash: start-up stops for good after the webhook's kinds
                          are listed and before the fleet's list (`watches.initial_list`),
                          so a test sees what a replica answers before its first full list
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass

__all__ = ["FAULT_POINTS", "Faults", "parse_fault"]

log = logging.getLogger(__name__)

FAULT_POINTS = (
    "kill-after-solve",
    "kill-after-reservation",
    "kill-while-ungating",
    "hold-fleet-list",
)
EXIT_KILLED = 137  # what a shell reports for SIGKILL (128 + 9)


def parse_fault(spec: str | None) -> tuple[str, int] | None:
    """`"kill-after-solve:3"` → `("kill-after-solve", 3)`; ValueError with what to write."""
    if not spec:
        return None
    point, _, nth = spec.partition(":")
    if point not in FAULT_POINTS:
        raise ValueError(f"{spec!r}: the point must be one of {', '.join(FAULT_POINTS)}")
    if nth and not (nth.isdigit() and int(nth) >= 1):
        raise ValueError(f"{spec!r}: the count after ':' must be a whole number ≥ 1")
    return point, int(nth or 1)


@dataclass(slots=True)
class Faults:
    point: str | None = None
    nth: int = 1
    seen: int = 0

    @classmethod
    def from_spec(cls, spec: str | None) -> Faults:
        parsed = parse_fault(spec)
        return cls(*parsed) if parsed else cls()

    def hit(self, point: str) -> None:
        if point != self.point:
            return
        self.seen += 1
        if self.seen < self.nth:
            return
        log.critical("NEXUS_FAULT %s:%d reached: exiting with %d", point, self.nth, EXIT_KILLED)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_KILLED)

    async def hold(self, point: str) -> None:
        """Wait for ever at `point` when it is the one set (the process keeps serving what
        already runs: its webhook, its health endpoint)."""
        if point != self.point:
            return
        log.critical("NEXUS_FAULT %s reached: holding here until the process is stopped", point)
        await asyncio.Event().wait()
