"""`nexus-admit run` options, validated once at start-up with messages that say what to fix.

Who calls it: `commands/run.py` builds `RunOptions` from flags and environment variables;
`operator.py` reads them. Nothing else reads the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nexus_admit.controller.faults import parse_fault

__all__ = ["OptionsError", "RunOptions"]


class OptionsError(ValueError):
    """An option that cannot work, with the flag (or variable) to change."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    kubeconfig: str | None = None  # None: $KUBECONFIG, ~/.kube/config, else in-cluster
    dry_run: bool = False  # decide and log, write nothing
    webhook: bool = True  # serve the pod webhook (the gate) in this process
    webhook_addr: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_cert: str | None = None
    webhook_key: str | None = None
    health_addr: str = "0.0.0.0"
    health_port: int = 8080  # /healthz, /readyz, /metrics
    policy: str = "nexus"
    resync_seconds: float = 60.0  # full re-list of every watched kind
    tick_seconds: float = 5.0  # the longest the loop sleeps without an event (TTL, holds)
    retry_seconds: int = 15  # first Retry delay; doubles per retry, capped
    log_level: str = "INFO"
    # test-only (controller/faults.py): die at a named point, e.g. "kill-after-solve:3"
    fault: str | None = None

    def validate(self) -> RunOptions:
        if self.kubeconfig and not Path(self.kubeconfig).is_file():
            raise OptionsError(f"--kubeconfig {self.kubeconfig}: no such file")
        for flag, port in (
            ("--webhook-port", self.webhook_port),
            ("--health-port", self.health_port),
        ):
            if not 0 <= port <= 65535:
                raise OptionsError(f"{flag} {port}: not a TCP port (0-65535)")
        if self.webhook:
            if not (self.webhook_cert and self.webhook_key):
                raise OptionsError(
                    "the pod webhook needs --webhook-cert and --webhook-key (PEM files of its "
                    "serving certificate; NEXUS_WEBHOOK_CERT / NEXUS_WEBHOOK_KEY), or --no-webhook"
                )
            for flag, path in (
                ("--webhook-cert", self.webhook_cert),
                ("--webhook-key", self.webhook_key),
            ):
                if not os.access(path, os.R_OK):
                    raise OptionsError(f"{flag} {path}: cannot read the file")
        if self.resync_seconds < 5:
            raise OptionsError(f"--resync-seconds {self.resync_seconds}: at least 5")
        if not 0.1 <= self.tick_seconds <= 60:
            raise OptionsError(f"--tick-seconds {self.tick_seconds}: between 0.1 and 60")
        if self.retry_seconds < 1:
            raise OptionsError(f"--retry-seconds {self.retry_seconds}: at least 1")
        try:
            parse_fault(self.fault)
        except ValueError as e:
            raise OptionsError(f"NEXUS_FAULT {e}") from None
        return self
