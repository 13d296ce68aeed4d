"""The list of queues whose pods the apiserver gates at creation, kept in a ConfigMap.

The pod gate policy (`kube/pod_gate_policy.queue_gate_policy`) runs in the apiserver,
where CEL cannot look a LocalQueue up; its binding names this ConfigMap as its parameter,
and it gates a pod created with the queue label unless "<namespace>.<queue>" is listed in
the ConfigMap's data with "" (a queue known not to use our check). Here the leader writes
every LocalQueue (`kube/queues.gated_queues`): its ClusterQueue as the value when that lists
one of our AdmissionChecks, else "", and every StatefulSet with its queue's value (Kueue
suspends a StatefulSet's pods without putting the queue label on them at creation). Pods
of the queues listed with "" never match the policy nor reach the webhook, so an outage
of nexus-admit cannot hold them up; a queue (or StatefulSet) created a moment before its
first pods (not listed yet) is gated to be safe, and the ungater lifts the gate once Kueue
admits a pod without a reservation of ours (`ungating.ungater.unpinned_release`). Only a
queue or StatefulSet created while no replica runs waits for nexus-admit (or
`nexus-admit release`).

Who calls it: `check_config.sync_checks`, once per pass (leader only). The ConfigMap is
written by server-side apply under our field manager, only when the list changed (and
once after a start, when it is not known what the ConfigMap holds).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from dataclasses import dataclass

from nexus_admit.controller.context import Context
from nexus_admit.kube.queues import gated_queues

__all__ = ["QueueGate", "configmap_body", "sync_queue_gate"]

log = logging.getLogger(__name__)


@dataclass
class QueueGate:
    """The queue list this process last wrote to the gate policy's ConfigMap (None: not
    written yet)."""

    written: dict[str, str] | None = None

    def reset(self) -> None:
        self.written = None  # a new leader writes it once: the last one may have since


def configmap_body(namespace: str, name: str, listed: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": dict(sorted(listed.items())),
    }


async def sync_queue_gate(ctx: Context, checks: Collection[str]) -> None:
    """Write the queue list when it changed; a failure is logged and retried next pass."""
    target = ctx.options.queue_gate_configmap
    if not target:
        return
    listed, problems = gated_queues(
        ctx.store.items("LocalQueue"),
        ctx.store.items("ClusterQueue"),
        checks,
        ctx.store.items("StatefulSet"),
    )
    state = ctx.component(QueueGate)
    if listed == state.written:
        return
    for problem in problems:
        log.warning("%s", problem)
    namespace, _, name = target.partition("/")
    try:
        await asyncio.to_thread(ctx.api.apply, "ConfigMap", configmap_body(namespace, name, listed))
    except Exception as e:  # the next pass tries again; placement goes on meanwhile
        ctx.metrics.errors.labels("queue_gate").inc()
        log.warning("could not write the gated queues to ConfigMap %s: %s", target, e)
        return
    gated = sorted(k for k, v in listed.items() if v)
    log.info(
        "ConfigMap %s lists %d queues and StatefulSets, %d of them gated: %s",
        target,
        len(listed),
        len(gated),
        ", ".join(gated[:20]) + (" …" if len(gated) > 20 else "") or "(none)",
    )
    state.written = listed
