"""`nexus-admit run` options, validated once at start-up with messages that say what to fix.

Who calls it: `commands/run.py` builds `RunOptions` from flags and environment variables;
`operator.py` reads them. Nothing else reads the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from nexus_admit.controller.faults import parse_fault

__all__ = [
    "METRICS_AUTH",
    "SERVICE_ACCOUNT_NAMESPACE_FILE",
    "OptionsError",
    "RunOptions",
    "service_account_namespace",
]

METRICS_AUTH = ("none", "kubernetes")

# the namespace of the pod's ServiceAccount, mounted by the kubelet
SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


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
    webhook_cert_check_seconds: float = 10.0  # how often the cert files are checked for a new pair
    health_addr: str = "0.0.0.0"
    health_port: int = 8080  # /healthz, /readyz, /metrics
    # "kubernetes": /metrics answers only bearer tokens the apiserver authenticates
    # (TokenReview) and authorises for GET /metrics (SubjectAccessReview); "none": open
    metrics_auth: str = "none"
    # PEM files: serve /healthz, /readyz and /metrics over HTTPS with this certificate
    # (reloaded when the files change, as the webhook's); None: plain HTTP
    metrics_cert: str | None = None
    metrics_key: str | None = None
    policy: str = "nexus"
    # full re-list of every watched kind, for safety only: a kind is re-listed when its
    # watch stream finds a gap (controller/runtime/informer.py) and every kind after a failed call
    resync_seconds: float = 600.0
    # how long a write the store has not shown yet is held: a create whose answer was lost
    # (its slots stay taken), a withdrawn reservation's delete (not answered from)
    lost_write_seconds: float = 120.0
    # lists are read in pages of this many objects (0: one unpaginated GET per kind), each
    # page given list_page_timeout seconds (controller/api.py KubeApi.list)
    list_page_size: int = 500
    list_page_timeout: float = 30.0
    tick_seconds: float = 5.0  # the longest the loop sleeps without an event (TTL, holds)
    retry_seconds: int = 15  # first Retry delay; doubles per retry, capped
    # reservation creates a pass keeps on the wire while it solves the next Workloads
    # (controller/writes.py WritePipeline); 1: each decision waits for the create before it
    creates_in_flight: int = 4
    # how often what survived since the last freeze is frozen out of the garbage
    # collector's full walks, the controller running the collector between passes
    # (controller/runtime/gc_control.py); 0: never, and CPython runs it as it does by default
    heap_freeze_seconds: float = 60.0
    # log, at each freeze, the commonest types frozen and freed from reference cycles
    # (a diagnostic: it walks the heap not frozen, and keeps the garbage until counted)
    heap_census: bool = False
    log_level: str = "INFO"
    # leader election (controller/runtime/lease.py): off locally, on in the chart
    leader_elect: bool = False
    lease_name: str = "nexus-admit"
    lease_namespace: str | None = None  # None: the ServiceAccount's namespace
    leader_identity: str | None = None  # None: hostname_pid
    lease_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    lease_retry_seconds: float = 2.0
    # the ConfigMap ("namespace/name") the gate policy reads: the LocalQueues whose
    # ClusterQueue lists our check (controller/queue_gate.py); None: not maintained
    queue_gate_configmap: str | None = None
    # seconds without any leader (the Lease expired, nobody took it) after which a follower
    # marks our AdmissionChecks Active=False (controller/degraded.py); 0: never
    degraded_after_seconds: float = 60.0
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
        if self.webhook_cert_check_seconds <= 0:
            raise OptionsError(
                f"--webhook-cert-check-seconds {self.webhook_cert_check_seconds}: above 0"
            )
        if bool(self.metrics_cert) != bool(self.metrics_key):
            raise OptionsError("--metrics-cert and --metrics-key go together (or neither)")
        for flag, tls_file in (
            ("--metrics-cert", self.metrics_cert),
            ("--metrics-key", self.metrics_key),
        ):
            if tls_file and not os.access(tls_file, os.R_OK):
                raise OptionsError(f"{flag} {tls_file}: cannot read the file")
        if self.metrics_auth not in METRICS_AUTH:
            raise OptionsError(
                f"--metrics-auth {self.metrics_auth!r}: one of {', '.join(METRICS_AUTH)}"
            )
        self._validate_loop()
        if self.leader_elect:
            if not self.lease_name:
                raise OptionsError("--lease-name: must not be empty")
            if not 0 < self.lease_retry_seconds < self.renew_deadline_seconds < self.lease_seconds:
                raise OptionsError(
                    f"leader election needs 0 < --lease-retry-seconds ({self.lease_retry_seconds})"
                    f" < --renew-deadline-seconds ({self.renew_deadline_seconds}) < "
                    f"--lease-seconds ({self.lease_seconds}): a leader must stop acting before "
                    "another replica may take its lease"
                )
            if not self.lease_namespace:
                raise OptionsError(
                    "--leader-elect needs the Lease's namespace: --lease-namespace or "
                    f"NEXUS_NAMESPACE (in a pod it is read from {SERVICE_ACCOUNT_NAMESPACE_FILE})"
                )
        if self.queue_gate_configmap is not None:
            ns, _, name = self.queue_gate_configmap.partition("/")
            if not (ns and name) or "/" in name:
                raise OptionsError(
                    f"--queue-gate-configmap {self.queue_gate_configmap!r}: write it as "
                    "NAMESPACE/NAME (the ConfigMap the pod gate policy's binding names)"
                )
        if self.degraded_after_seconds < 0:
            raise OptionsError(
                f"--degraded-after-seconds {self.degraded_after_seconds}: 0 (never) or more"
            )
        try:
            parse_fault(self.fault)
        except ValueError as e:
            raise OptionsError(f"NEXUS_FAULT {e}") from None
        return self

    def _validate_loop(self) -> None:
        """The loop's periods and sizes: re-lists, pages, ticks, creates in flight."""
        if self.resync_seconds < 5:
            raise OptionsError(f"--resync-seconds {self.resync_seconds}: at least 5")
        if self.lost_write_seconds < 10:
            raise OptionsError(f"--lost-write-seconds {self.lost_write_seconds}: at least 10")
        if self.list_page_size < 0:
            raise OptionsError(
                f"--list-page-size {self.list_page_size}: 0 (no pages) or more objects"
            )
        if self.list_page_timeout <= 0:
            raise OptionsError(f"--list-page-timeout {self.list_page_timeout}: above 0")
        if not 0.1 <= self.tick_seconds <= 60:
            raise OptionsError(f"--tick-seconds {self.tick_seconds}: between 0.1 and 60")
        if not 1 <= self.creates_in_flight <= 64:
            raise OptionsError(f"--creates-in-flight {self.creates_in_flight}: between 1 and 64")
        if self.retry_seconds < 1:
            raise OptionsError(f"--retry-seconds {self.retry_seconds}: at least 1")
        if self.heap_freeze_seconds != 0 and self.heap_freeze_seconds < 10:
            raise OptionsError(
                f"--heap-freeze-seconds {self.heap_freeze_seconds}: 0 (never) or at least 10 "
                "(each refreeze costs one full collection)"
            )


def service_account_namespace(path: str = SERVICE_ACCOUNT_NAMESPACE_FILE) -> str | None:
    """The pod's own namespace, when running in a pod (None outside one)."""
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None
