"""`nexus-admit run`: the admission controller (kopf operator + pod webhook).

    nexus-admit run [--kubeconfig FILE] [--dry-run] [--webhook-cert F --webhook-key F |
                    --no-webhook] [--webhook-port 9443] [--health-port 8080]
                    [--leader-elect [--lease-namespace NS]] ...

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


def run(
    kubeconfig: Annotated[
        str | None,
        typer.Option(envvar="KUBECONFIG", help="kubeconfig file; default in-cluster config."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", envvar="NEXUS_DRY_RUN", help="Decide and log; write nothing."),
    ] = False,
    webhook: Annotated[
        bool,
        typer.Option(
            "--webhook/--no-webhook", envvar="NEXUS_WEBHOOK", help="Serve the pod webhook."
        ),
    ] = True,
    webhook_addr: Annotated[str, typer.Option(envvar="NEXUS_WEBHOOK_ADDR")] = "0.0.0.0",
    webhook_port: Annotated[int, typer.Option(envvar="NEXUS_WEBHOOK_PORT")] = 9443,
    webhook_cert: Annotated[
        str | None, typer.Option(envvar="NEXUS_WEBHOOK_CERT", help="PEM serving certificate.")
    ] = None,
    webhook_key: Annotated[
        str | None, typer.Option(envvar="NEXUS_WEBHOOK_KEY", help="PEM private key.")
    ] = None,
    webhook_cert_check_seconds: Annotated[
        float,
        typer.Option(
            envvar="NEXUS_WEBHOOK_CERT_CHECK_SECONDS",
            help="How often to check the cert/key files; a new pair is served without a restart.",
        ),
    ] = 10.0,
    health_addr: Annotated[str, typer.Option(envvar="NEXUS_HEALTH_ADDR")] = "0.0.0.0",
    health_port: Annotated[
        int, typer.Option(envvar="NEXUS_HEALTH_PORT", help="/healthz, /readyz and /metrics.")
    ] = 8080,
    metrics_auth: Annotated[
        str,
        typer.Option(
            envvar="NEXUS_METRICS_AUTH",
            help="none: /metrics is open; kubernetes: only callers the apiserver authenticates "
            "(TokenReview) and authorises for GET /metrics (SubjectAccessReview).",
        ),
    ] = "none",
    policy: Annotated[str, typer.Option(envvar="NEXUS_POLICY", help="Placement policy.")] = "nexus",
    resync_seconds: Annotated[float, typer.Option(envvar="NEXUS_RESYNC_SECONDS")] = 60.0,
    retry_seconds: Annotated[
        int, typer.Option(envvar="NEXUS_RETRY_SECONDS", help="First Retry delay (doubles).")
    ] = 15,
    log_level: Annotated[str, typer.Option(envvar="NEXUS_LOG_LEVEL")] = "INFO",
    leader_elect: Annotated[
        bool,
        typer.Option(
            "--leader-elect/--no-leader-elect",
            envvar="NEXUS_LEADER_ELECT",
            help="Act only while holding a Lease (run two replicas safely).",
        ),
    ] = False,
    lease_name: Annotated[
        str, typer.Option(envvar="NEXUS_LEASE_NAME", help="Name of the leader Lease.")
    ] = "nexus-admit",
    lease_namespace: Annotated[
        str | None,
        typer.Option(
            envvar="NEXUS_NAMESPACE",
            help="Namespace of the leader Lease; default: the pod's own namespace.",
        ),
    ] = None,
    leader_identity: Annotated[
        str | None,
        typer.Option(envvar="NEXUS_LEADER_IDENTITY", help="Holder identity; default hostname_pid."),
    ] = None,
    lease_seconds: Annotated[float, typer.Option(envvar="NEXUS_LEASE_SECONDS")] = 15.0,
    renew_deadline_seconds: Annotated[
        float, typer.Option(envvar="NEXUS_RENEW_DEADLINE_SECONDS")
    ] = 10.0,
    lease_retry_seconds: Annotated[float, typer.Option(envvar="NEXUS_LEASE_RETRY_SECONDS")] = 2.0,
    fault: Annotated[
        str | None,
        typer.Option(envvar="NEXUS_FAULT", hidden=True, help="Test only: crash at a point."),
    ] = None,
) -> None:
    """Run the admission controller: place Workloads waiting on the nexus AdmissionCheck."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("kopf", "aiohttp.access", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
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
            policy=policy,
            resync_seconds=resync_seconds,
            retry_seconds=retry_seconds,
            log_level=log_level,
            leader_elect=leader_elect,
            lease_name=lease_name,
            lease_namespace=lease_namespace or service_account_namespace(),
            leader_identity=leader_identity,
            lease_seconds=lease_seconds,
            renew_deadline_seconds=renew_deadline_seconds,
            lease_retry_seconds=lease_retry_seconds,
            fault=fault,
        ).validate()
    except OptionsError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_OPTIONS) from None
    from nexus_admit.controller.operator import run as run_operator
    from nexus_admit.placement.policies import policy_names

    if policy not in policy_names():
        typer.echo(
            f"error: --policy {policy}: unknown (known: {', '.join(policy_names())})", err=True
        )
        raise typer.Exit(EXIT_OPTIONS)
    from nexus_admit.controller.tls import CertificateError
    from nexus_admit.controller.webhook_thread import WebhookStartError

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
