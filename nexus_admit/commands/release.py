"""`nexus-admit release`: the way out when nexus-admit is down and work waits on it.

    nexus-admit release [--kubeconfig FILE] [--dry-run] [--stop-gating NAMESPACE/NAME]

It answers every pending check of ours Ready, with a message saying an admin released it
without placement (so Kueue admits the Workload and kube-scheduler places its pods), and
lifts our scheduling gate (`scheduling.kubenexus.io/placement`) from every pod. With
`--stop-gating` it also deletes the ConfigMap the queue gate policy reads, so pods created
from now on are not gated either (the controller writes it again when it is back).
Idempotent: a second run finds nothing left to do. Run it as a cluster admin, with the
controller stopped (a running leader may place the same Workloads meanwhile, harmlessly:
the first answer wins). See docs/admin-guide.md, "When nexus-admit is down".
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import TranslationError, child, meta
from nexus_admit.kube.kueue import is_pending_on_check, our_check_names, pending_checks

if TYPE_CHECKING:  # the client is imported when the command runs (it needs the controller extra)
    from nexus_admit.controller.api import KubeApi

__all__ = ["RELEASE_MESSAGE", "Release", "plan_release", "register", "release"]

EXIT_FAILED = 1
RELEASE_MESSAGE = (
    "released by an admin without placement (nexus-admit release): nexus-admit was not "
    "placing; kube-scheduler places the pods"
)


@dataclass(frozen=True, slots=True)
class Release:
    checks: list[tuple[str, str, str]]  # (namespace, workload, check) answered Ready
    pods: list[tuple[str, str]]  # (namespace, pod) whose gate is lifted


def _gated(pod: Mapping[str, Any]) -> bool:
    gates = child(pod, "spec").get("schedulingGates")
    return isinstance(gates, list) and any(
        isinstance(g, Mapping) and g.get("name") == L.GATE_PLACEMENT for g in gates
    )


def _pending_checks(workload: Mapping[str, Any], ours: Collection[str]) -> list[str]:
    try:
        if not is_pending_on_check(workload, ours):
            return []
    except TranslationError:  # a malformed Workload: nothing of ours to answer
        return []
    return pending_checks(workload, ours)


def plan_release(
    admission_checks: Iterable[Mapping[str, Any]],
    workloads: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> Release:
    """What `release` writes: each Pending entry of our checks on a Workload with quota
    reserved, and each pod that carries our gate. Malformed objects are skipped."""
    ours = our_check_names(a for a in admission_checks if isinstance(a, Mapping))
    checks = [
        (str(meta(w).get("namespace")), str(meta(w).get("name")), name)
        for w in workloads
        if isinstance(w, Mapping)
        for name in _pending_checks(w, ours)
    ]
    lifted = [
        (str(meta(p).get("namespace")), str(meta(p).get("name")))
        for p in pods
        if isinstance(p, Mapping) and _gated(p)
    ]
    return Release(sorted(checks), sorted(lifted))


def release(
    kubeconfig: Annotated[
        str | None,
        typer.Option(envvar="KUBECONFIG", help="kubeconfig file; default in-cluster config."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be released; write nothing.")
    ] = False,
    stop_gating: Annotated[
        str | None,
        typer.Option(
            help="NAMESPACE/NAME of the queue gate ConfigMap (the chart's "
            "<release>-gated-queues): delete it, so new pods are not gated until the "
            "controller is back.",
        ),
    ] = None,
) -> None:
    """Release all work waiting on nexus-admit: answer every pending nexus check Ready
    (without placement) and lift every nexus scheduling gate. For when nexus-admit is down."""
    from nexus_admit.controller.api import KubeApi, load_api_client

    api = KubeApi(load_api_client(kubeconfig))
    plan = plan_release(api.list("AdmissionCheck")[0], api.list("Workload")[0], api.list("Pod")[0])
    # the checks first: a pod whose gate is lifted still waits for Kueue's own gate
    failed = _answer_checks(api, plan.checks, dry_run)
    failed += _lift_gates(api, plan.pods, dry_run)
    if stop_gating:
        failed += _stop_gating(api, stop_gating, dry_run)
    typer.echo(
        f"{'dry run: ' if dry_run else ''}{len(plan.checks)} check(s) answered, "
        f"{len(plan.pods)} pod(s) ungated"
        + (f", {failed} failed (run it again)" if failed else "")
        + ("" if plan.checks or plan.pods else ": nothing waits on nexus-admit")
    )
    if failed:
        raise typer.Exit(EXIT_FAILED)


def _answer_checks(api: KubeApi, checks: list[tuple[str, str, str]], dry_run: bool) -> int:
    """Each check Ready with the release message; the number that failed."""
    verb = "would " if dry_run else ""
    failed = 0
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for ns, workload, check in checks:
        body = {
            "apiVersion": L.KUEUE_GROUP_VERSION,
            "kind": "Workload",
            "metadata": {"name": workload, "namespace": ns},
            "status": {
                "admissionChecks": [
                    {
                        "name": check,
                        "state": "Ready",
                        "message": RELEASE_MESSAGE,
                        "lastTransitionTime": now,
                    }
                ]
            },
        }
        try:
            if not dry_run:
                api.apply_status("Workload", body)
        except Exception as e:  # reported; the rest goes on
            failed += 1
            typer.echo(f"FAILED   Workload {ns}/{workload}: check {check}: {e}", err=True)
            continue
        typer.echo(f"{verb}answer  Workload {ns}/{workload}: check {check} Ready (released)")
    return failed


def _lift_gates(api: KubeApi, pods: list[tuple[str, str]], dry_run: bool) -> int:
    """Our scheduling gate off each pod; the number that failed."""
    verb = "would " if dry_run else ""
    failed = 0
    patch = {"spec": {"schedulingGates": [{"$patch": "delete", "name": L.GATE_PLACEMENT}]}}
    for ns, pod in pods:
        try:
            if not dry_run:
                api.patch_pod(pod, ns, patch)
        except Exception as e:
            failed += 1
            typer.echo(f"FAILED   Pod {ns}/{pod}: {e}", err=True)
            continue
        typer.echo(f"{verb}ungate  Pod {ns}/{pod}")
    return failed


def _stop_gating(api: KubeApi, configmap: str, dry_run: bool) -> int:
    """Delete the queue gate policy's ConfigMap ("namespace/name"); 1 when that failed."""
    verb = "would " if dry_run else ""
    ns, _, name = configmap.partition("/")
    try:
        gone = dry_run or api.delete("ConfigMap", name, ns)
    except Exception as e:
        typer.echo(f"FAILED   ConfigMap {configmap}: {e}", err=True)
        return 1
    state = "deleted" if gone else "already gone"
    typer.echo(f"{verb}stop gating: ConfigMap {configmap} {'delete' if dry_run else state}")
    return 0


def register(app: typer.Typer) -> None:
    app.command("release")(release)
