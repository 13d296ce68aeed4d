"""Our AdmissionChecks: which PlacementConfig each one means, and its `Active` condition.

Who calls it: `loop/cycle.py`, at the start of every pass. A check is ours when its
`spec.controllerName` is `kubenexus.io/placement`. Its `spec.parameters` names a
PlacementConfig (none: the built-in defaults). A missing or invalid config makes the check
`Active=False` with a message that says what is wrong, and Kueue then deactivates the
ClusterQueues that use it, as it intends, rather than letting Workloads through unplaced.
The condition is written only when it changes (as Kueue's provisioning check does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nexus_admit.controller.context import CheckView, Context
from nexus_admit.controller.queue_gate import sync_queue_gate
from nexus_admit.kube import labels as L
from nexus_admit.kube.dump import ClusterDump
from nexus_admit.kube.errors import TranslationError, child, meta
from nexus_admit.kube.kueue import our_check_names
from nexus_admit.kube.queues import multikueue_managers
from nexus_admit.kube.translate import placement_config_from_object
from nexus_admit.model import PlacementConfig

__all__ = ["CheckInputs", "active_condition", "on_manager", "resolve_check", "sync_checks"]

log = logging.getLogger(__name__)


@dataclass
class CheckInputs:
    """Check name → (what its view was resolved from, the view): kept while nothing
    changed."""

    resolved: dict[str, tuple[object, CheckView]] = field(default_factory=dict)

    def reset(self) -> None:
        self.resolved = {}


def resolve_check(
    check: Mapping[str, Any],
    configs: Mapping[str, Mapping[str, Any]],
    topologies: Mapping[str, tuple[str, ...]],
) -> CheckView:
    """The config an AdmissionCheck of ours refers to, or the problem that stops it."""
    name = str(meta(check).get("name"))
    spec = child(check, "spec")
    params = spec.get("parameters")
    if not params:
        return CheckView(name, PlacementConfig())
    if not isinstance(params, Mapping):
        return CheckView(name, None, "spec.parameters: expected an object")
    if params.get("kind") != L.KIND_PLACEMENT_CONFIG or params.get("apiGroup") != L.API_GROUP:
        return CheckView(
            name,
            None,
            f"spec.parameters must name a {L.KIND_PLACEMENT_CONFIG} (apiGroup {L.API_GROUP}), "
            f"not {params.get('apiGroup')}/{params.get('kind')}",
        )
    config_name = str(params.get("name") or "")
    obj = configs.get(config_name)
    if obj is None:
        return CheckView(
            name, None, f"PlacementConfig {config_name!r} named in spec.parameters does not exist"
        )
    try:
        config = placement_config_from_object(obj)
        config.resolve_levels(topologies)
    except TranslationError as e:
        return CheckView(name, None, str(e))
    except ValueError as e:
        return CheckView(name, None, f"PlacementConfig {config_name}: {e}")
    return CheckView(name, config)


def on_manager(check: str, cluster_queue: str) -> CheckView:
    """A check listed by a MultiKueue manager's ClusterQueue is inactive: the manager
    dispatches Workloads to worker clusters and has no GPU nodes to place them on, so every
    Workload would be refused one by one. Kueue then marks the ClusterQueue inactive with
    this message, where its admin looks."""
    return CheckView(
        check, None,
        f"ClusterQueue {cluster_queue} is a MultiKueue manager's (it also lists a MultiKueue "
        f"check): list {check} on the worker clusters' ClusterQueues instead, where the GPU "
        "nodes are", reason="MultiKueueManager")


def active_condition(view: CheckView) -> dict[str, str]:
    if view.config is None:
        return {
            "type": "Active",
            "status": "False",
            "reason": view.reason,
            "message": view.problem,
        }
    return {
        "type": "Active",
        "status": "True",
        "reason": "Ready",
        "message": "nexus-admit places Workloads of this check",
    }


def _current(check: Mapping[str, Any]) -> dict[str, Any]:
    status = child(check, "status")
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "Active":
            return dict(c)
    return {}


def _resolved(
    ctx: Context,
    check: Mapping[str, Any],
    configs: Mapping[str, Mapping[str, Any]],
    topologies: Mapping[str, tuple[str, ...]],
) -> CheckView:
    """`resolve_check`, or the last pass's view when nothing it reads changed: the same
    PlacementConfig object from pass to pass, which the engine's per-snapshot caches are
    keyed on (a new object per pass rebuilt them on every decision)."""
    try:
        params = child(check, "spec").get("parameters")
        config = configs.get(str(params.get("name"))) if isinstance(params, Mapping) else None
        inputs: object = (
            repr(params),
            (meta(config).get("uid"), meta(config).get("resourceVersion")) if config else None,
            tuple(sorted(topologies.items())),
        )
        name = str(meta(check).get("name"))
    except Exception:  # malformed: resolve_check says what is wrong
        return resolve_check(check, configs, topologies)
    resolved = ctx.component(CheckInputs).resolved
    known = resolved.get(name)
    if known is not None and known[0] == inputs:
        return known[1]
    view = resolve_check(check, configs, topologies)
    resolved[name] = (inputs, view)
    return view


async def sync_checks(ctx: Context) -> None:
    """Refresh `ctx.checks` and write each check's Active condition when it changed."""
    configs = {str(meta(o).get("name")): o for o in ctx.store.items(L.KIND_PLACEMENT_CONFIG)}
    # the Topologies alone: a dump of the whole store would list every pod for them
    topologies = ClusterDump(by_kind={"Topology": ctx.store.items("Topology")}).kueue_topologies()
    views: dict[str, CheckView] = {}
    checks = ctx.store.items("AdmissionCheck")
    managers = multikueue_managers(
        ctx.store.items("ClusterQueue"), checks, our_check_names(checks))
    for check in checks:
        spec = child(check, "spec")
        if spec.get("controllerName") != L.ADMISSION_CHECK_CONTROLLER:
            continue
        view = _resolved(ctx, check, configs, topologies)
        if view.name in managers:
            view = on_manager(view.name, managers[view.name])
        views[view.name] = view
        want = active_condition(view)
        have = _current(check)
        if all(have.get(k) == v for k, v in want.items()):
            continue
        if view.config is None:
            log.warning("AdmissionCheck %s inactive: %s", view.name, view.problem)
        cond = {**want, "lastTransitionTime": ctx.clocks.wall().strftime("%Y-%m-%dT%H:%M:%SZ")}
        body = {
            "apiVersion": L.KUEUE_GROUP_VERSION,
            "kind": "AdmissionCheck",
            "metadata": {"name": view.name},
            "status": {"conditions": [cond]},
        }
        try:
            await asyncio.to_thread(ctx.api.apply_status, "AdmissionCheck", body)
        except Exception as e:  # retried next pass; the loop must not die of one check
            ctx.metrics.errors.labels("admissioncheck").inc()
            log.warning("could not set Active on AdmissionCheck %s: %s", view.name, e)
    ctx.checks = views
    state = ctx.component(CheckInputs)
    state.resolved = {k: v for k, v in state.resolved.items() if k in views}
    # every check of ours, active or not: a pod of its queues is gated either way
    await sync_queue_gate(ctx, our_check_names(ctx.store.items("AdmissionCheck")))
