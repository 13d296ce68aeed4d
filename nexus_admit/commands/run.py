"""`nexus-admit run`: the admission controller (kopf operator + pod webhook).

    nexus-admit run [--kubeconfig FILE] [--dry-run] [--webhook-cert F --webhook-key F |
                    --no-webhook] [--webhook-port 9443] [--health-port 8080]
                    [--leader-elect [--lease-namespace NS]] [--tick-seconds 5] ...

Every flag has an environment variable (NEXUS_*), for the chart. Bad options stop it at
once with the flag to fix and exit code 2.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from nexus_admit.controller.options import OptionsError, RunOptions, service_account_namespace

__all__ = ["register", "run"]

EXIT_OPTIONS = 2

# Every default is RunOptions's: the flags below only say how each is spelt and explained.
_D = RunOptions()

_Kubeconfig = Annotated[
    str | None,
    typer.Option(envvar="KUBECONFIG", help="kubeconfig file; default in-cluster config."),
]
_DryRun = Annotated[
    bool, typer.Option("--dry-run", envvar="NEXUS_DRY_RUN", help="Decide and log; write nothing.")
]
_Webhook = Annotated[
    bool,
    typer.Option("--webhook/--no-webhook", envvar="NEXUS_WEBHOOK", help="Serve the pod webhook."),
]
_WebhookAddr = Annotated[str, typer.Option(envvar="NEXUS_WEBHOOK_ADDR")]
_WebhookPort = Annotated[int, typer.Option(envvar="NEXUS_WEBHOOK_PORT")]
_WebhookCert = Annotated[
    str | None, typer.Option(envvar="NEXUS_WEBHOOK_CERT", help="PEM serving certificate.")
]
_WebhookKey = Annotated[
    str | None, typer.Option(envvar="NEXUS_WEBHOOK_KEY", help="PEM private key.")
]
_CertCheckSeconds = Annotated[
    float,
    typer.Option(
        envvar="NEXUS_WEBHOOK_CERT_CHECK_SECONDS",
        help="How often to check the cert/key files; a new pair is served without a restart.",
    ),
]
_HealthAddr = Annotated[str, typer.Option(envvar="NEXUS_HEALTH_ADDR")]
_HealthPort = Annotated[
    int, typer.Option(envvar="NEXUS_HEALTH_PORT", help="/healthz, /readyz and /metrics.")
]
_Policy = Annotated[str, typer.Option(envvar="NEXUS_POLICY", help="Placement policy.")]
_ResyncSeconds = Annotated[
    float,
    typer.Option(
        envvar="NEXUS_RESYNC_SECONDS",
        help="Full re-list of every watched kind, for safety: a kind whose watch finds a gap "
        "(410 Gone) is re-listed at once, every kind after a failed API call.",
    ),
]
_LostWriteSeconds = Annotated[
    float,
    typer.Option(
        envvar="NEXUS_LOST_WRITE_SECONDS",
        help="How long a write the watch has not shown is held (a create whose answer was "
        "lost keeps its GPUs taken).",
    ),
]
_ListPageSize = Annotated[
    int,
    typer.Option(
        envvar="NEXUS_LIST_PAGE_SIZE",
        help="Objects per page of a list (limit/continue); 0: one unpaginated GET per kind.",
    ),
]
_ListPageTimeout = Annotated[
    float,
    typer.Option(envvar="NEXUS_LIST_PAGE_TIMEOUT", help="Seconds one page of a list may take."),
]
_TickSeconds = Annotated[
    float,
    typer.Option(
        envvar="NEXUS_TICK_SECONDS",
        help="The longest the loop sleeps without an event (expiries, holds); 0.1 to 60.",
    ),
]
_RetrySeconds = Annotated[
    int, typer.Option(envvar="NEXUS_RETRY_SECONDS", help="First Retry delay (doubles).")
]
_CreatesInFlight = Annotated[
    int,
    typer.Option(
        envvar="NEXUS_CREATES_IN_FLIGHT",
        help="Reservation creates kept in flight while the next Workloads are solved; 1 to 64 "
        "(1: each decision waits for the previous create).",
    ),
]
_HeapFreezeSeconds = Annotated[
    float,
    typer.Option(
        envvar="NEXUS_HEAP_FREEZE_SECONDS",
        help="How often the store's long-lived objects are re-frozen out of the garbage "
        "collector's full walks (each a pause of every thread), which is then run between "
        "passes, never inside a solve; 0: never, and the collector runs as CPython runs it.",
    ),
]
_HeapCensus = Annotated[
    bool,
    typer.Option(
        envvar="NEXUS_HEAP_CENSUS",
        help="At each freeze, log the commonest types frozen and freed from reference "
        "cycles (a diagnostic: it walks the heap not frozen yet).",
    ),
]
_LogLevel = Annotated[str, typer.Option(envvar="NEXUS_LOG_LEVEL")]
_LeaderElect = Annotated[
    bool,
    typer.Option(
        "--leader-elect/--no-leader-elect",
        envvar="NEXUS_LEADER_ELECT",
        help="Act only while holding a Lease (run two replicas safely).",
    ),
]
_LeaseName = Annotated[
    str, typer.Option(envvar="NEXUS_LEASE_NAME", help="Name of the leader Lease.")
]
_LeaseNamespace = Annotated[
    str | None,
    typer.Option(
        envvar="NEXUS_NAMESPACE",
        help="Namespace of the leader Lease; default: the pod's own namespace.",
    ),
]
_LeaderIdentity = Annotated[
    str | None,
    typer.Option(envvar="NEXUS_LEADER_IDENTITY", help="Holder identity; default hostname_pid."),
]
_LeaseSeconds = Annotated[float, typer.Option(envvar="NEXUS_LEASE_SECONDS")]
_RenewDeadlineSeconds = Annotated[float, typer.Option(envvar="NEXUS_RENEW_DEADLINE_SECONDS")]
_LeaseRetrySeconds = Annotated[float, typer.Option(envvar="NEXUS_LEASE_RETRY_SECONDS")]
_QueueGateConfigMap = Annotated[
    str | None,
    typer.Option(
        envvar="NEXUS_QUEUE_GATE_CONFIGMAP",
        help="NAMESPACE/NAME of the ConfigMap the pod gate policy reads: kept listing the "
        "LocalQueues whose ClusterQueue uses our check. Unset: not maintained.",
    ),
]
_DegradedAfterSeconds = Annotated[
    float,
    typer.Option(
        envvar="NEXUS_DEGRADED_AFTER_SECONDS",
        help="With --leader-elect: after this many seconds without any leader, a "
        "follower marks our AdmissionChecks Active=False with the reason. 0: never.",
    ),
]
_MetricsAuth = Annotated[
    str,
    typer.Option(
        envvar="NEXUS_METRICS_AUTH",
        help="none: /metrics is open; kubernetes: only callers the apiserver authenticates "
        "(TokenReview) and authorises for GET /metrics (SubjectAccessReview).",
    ),
]
_MetricsCert = Annotated[
    str | None,
    typer.Option(
        envvar="NEXUS_METRICS_CERT",
        help="PEM certificate: serve /metrics (and /healthz, /readyz) over HTTPS; with "
        "--metrics-key. Reloaded when the file changes.",
    ),
]
_MetricsKey = Annotated[
    str | None,
    typer.Option(envvar="NEXUS_METRICS_KEY", help="The private key of --metrics-cert (PEM)."),
]
_Fault = Annotated[
    str | None,
    typer.Option(envvar="NEXUS_FAULT", hidden=True, help="Test only: crash at a point."),
]


def run(
    kubeconfig: _Kubeconfig = _D.kubeconfig,
    dry_run: _DryRun = _D.dry_run,
    webhook: _Webhook = _D.webhook,
    webhook_addr: _WebhookAddr = _D.webhook_addr,
    webhook_port: _WebhookPort = _D.webhook_port,
    webhook_cert: _WebhookCert = _D.webhook_cert,
    webhook_key: _WebhookKey = _D.webhook_key,
    webhook_cert_check_seconds: _CertCheckSeconds = _D.webhook_cert_check_seconds,
    health_addr: _HealthAddr = _D.health_addr,
    health_port: _HealthPort = _D.health_port,
    metrics_auth: _MetricsAuth = _D.metrics_auth,
    metrics_cert: _MetricsCert = _D.metrics_cert,
    metrics_key: _MetricsKey = _D.metrics_key,
    policy: _Policy = _D.policy,
    resync_seconds: _ResyncSeconds = _D.resync_seconds,
    lost_write_seconds: _LostWriteSeconds = _D.lost_write_seconds,
    list_page_size: _ListPageSize = _D.list_page_size,
    list_page_timeout: _ListPageTimeout = _D.list_page_timeout,
    tick_seconds: _TickSeconds = _D.tick_seconds,
    retry_seconds: _RetrySeconds = _D.retry_seconds,
    creates_in_flight: _CreatesInFlight = _D.creates_in_flight,
    heap_freeze_seconds: _HeapFreezeSeconds = _D.heap_freeze_seconds,
    heap_census: _HeapCensus = _D.heap_census,
    log_level: _LogLevel = _D.log_level,
    leader_elect: _LeaderElect = _D.leader_elect,
    lease_name: _LeaseName = _D.lease_name,
    lease_namespace: _LeaseNamespace = _D.lease_namespace,
    leader_identity: _LeaderIdentity = _D.leader_identity,
    lease_seconds: _LeaseSeconds = _D.lease_seconds,
    renew_deadline_seconds: _RenewDeadlineSeconds = _D.renew_deadline_seconds,
    lease_retry_seconds: _LeaseRetrySeconds = _D.lease_retry_seconds,
    queue_gate_configmap: _QueueGateConfigMap = _D.queue_gate_configmap,
    degraded_after_seconds: _DegradedAfterSeconds = _D.degraded_after_seconds,
    fault: _Fault = _D.fault,
) -> None:
    """Run the admission controller: place Workloads waiting on the nexus AdmissionCheck."""
    _configure_logging(log_level)
    try:
        options = RunOptions(
            kubeconfig=kubeconfig,
            dry_run=dry_run,
            webhook=webhook,
            webhook_addr=webhook_addr,
            webhook_port=webhook_port,
            webhook_cert=webhook_cert,
            webhook_key=webhook_key,
            webhook_cert_check_seconds=webhook_cert_check_seconds,
            health_addr=health_addr,
            health_port=health_port,
            metrics_auth=metrics_auth,
            metrics_cert=metrics_cert,
            metrics_key=metrics_key,
            policy=policy,
            resync_seconds=resync_seconds,
            lost_write_seconds=lost_write_seconds,
            list_page_size=list_page_size,
            list_page_timeout=list_page_timeout,
            tick_seconds=tick_seconds,
            retry_seconds=retry_seconds,
            creates_in_flight=creates_in_flight,
            heap_freeze_seconds=heap_freeze_seconds,
            heap_census=heap_census,
            log_level=log_level,
            leader_elect=leader_elect,
            lease_name=lease_name,
            lease_namespace=lease_namespace or service_account_namespace(),
            leader_identity=leader_identity,
            lease_seconds=lease_seconds,
            renew_deadline_seconds=renew_deadline_seconds,
            lease_retry_seconds=lease_retry_seconds,
            queue_gate_configmap=queue_gate_configmap or None,
            degraded_after_seconds=degraded_after_seconds,
            fault=fault,
        ).validate()
    except OptionsError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_OPTIONS) from None
    _serve(options)


def _configure_logging(log_level: str) -> None:
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("kopf", "aiohttp.access", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def _serve(options: RunOptions) -> None:
    """Check the policy, then run the operator until it stops; start-up failures a flag
    can fix exit 2 naming the flag."""
    from nexus_admit.controller.operator import run as run_operator
    from nexus_admit.placement.policies import policy_names

    if options.policy not in policy_names():
        typer.echo(
            f"error: --policy {options.policy}: unknown (known: {', '.join(policy_names())})",
            err=True,
        )
        raise typer.Exit(EXIT_OPTIONS)
    from nexus_admit.controller.webhook.thread import WebhookStartError
    from nexus_admit.controller.webhook.tls import CertificateError

    try:
        asyncio.run(run_operator(options))
    except CertificateError as e:
        typer.echo(f"error: --webhook-cert/--webhook-key: {e}", err=True)
        raise typer.Exit(EXIT_OPTIONS) from None
    except WebhookStartError as e:
        where = f"{options.webhook_addr}:{options.webhook_port}"
        typer.echo(f"error: --webhook-addr/--webhook-port {where}: cannot serve: {e}", err=True)
        raise typer.Exit(EXIT_OPTIONS) from None


def register(app: typer.Typer) -> None:
    app.command("run")(run)
