"""Pin at creation: a pod whose slot is already known gets it in its create request, so it
needs no pin patch afterwards.

Why: the ungater pins each gated pod with a patch of its own, a write that every pod
watcher receives and that Kueue's pod webhook reviews again; on the load benchmark those
were the largest share of the requests nexus adds per Workload (docs/benchmarks.md). For a
Job's pods the reservation exists before the pods do (Kueue unsuspends the Job only after
our check is Ready), and a ranked pod's slot is the one of its rank, so the answer can be
given at creation.

Who calls it: the `pod-pin` hook of the MutatingWebhookConfiguration (chart value
`webhook.pinAtCreation`), registered only with the gate policies and only for pods the
trusted controllers create with a reservation label. The policy has already gated such a
pod (policies run before webhooks); this answer adds the pin and takes our gate off, or
leaves the pod as it came, gated, for the ungater. It never refuses a pod: the hook's
`failurePolicy` is Ignore, so with nexus-admit down or slow the pod is created gated, as
without the hook. For the same reason the gate policy is not reinvoked after the hook
(`reinvocationPolicy: Never` when pinning at creation), which would put the gate back.
Where no gate policy runs (Kubernetes before 1.36), the gate hook itself answers at
`/pod-gate-pin` (`answer_gate_or_pin_review`): the pin instead of the gate, for every pod
with a reservation label it would gate, with the gate hook's own failure policy.

The decision is `slot_assignment.creation_slot`: only the slot of the pod's own rank, and
only where no other pod of the reservation waits for one, so every replica answers the same
without a shared claim. The leader reads the pin back from the pod as for a pod it pinned
itself (its slot annotation). What it cannot see is a pod its replica's watch has not
brought yet: were the ungater pinning such a pod to this slot at that moment (only a pod
whose own slot is held, a replacement created while its predecessor still runs), the two
would share a node; kube-scheduler never binds beyond the node's allocatable, so the later
one waits unschedulable, as any pod that cannot fit its slot. It runs on the webhook's
thread, reads the store and writes nothing.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from functools import partial
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.displaced import is_displaced
from nexus_admit.controller.reservation_pods import failed_node
from nexus_admit.controller.ungating.slot_assignment import creation_slot, rank_rules, ranked_pod
from nexus_admit.controller.ungating.ungater import (
    node_name_terms,
    pinned_hostname,
    slot_annotations,
)
from nexus_admit.controller.webhook.review import (
    WebhookState,
    answer_review,
    foreign_reason,
    gated_spec,
    malformed_gates,
)
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import child, meta
from nexus_admit.kube.reservations import ReservedSlot
from nexus_admit.kube.views import PodView

__all__ = [
    "PIN_GATE_WEBHOOK_ID",
    "PIN_WEBHOOK_ID",
    "answer_gate_or_pin_review",
    "answer_pin_review",
    "creation_pin",
    "creation_pin_ops",
    "pin_ops",
]

log = logging.getLogger(__name__)

PIN_WEBHOOK_ID = "pod-pin"
# the gate hook's path where no gate policy runs and pods are pinned at creation
PIN_GATE_WEBHOOK_ID = "pod-gate-pin"


async def creation_pin(
    ctx: Context, pod: Mapping[str, Any], namespace: str
) -> tuple[ReservedSlot, str] | None:
    """(slot, hostname) for a pod being created, or None to leave it gated. Reads the
    store, and the owners above the pod only when its own do not prove it the Workload's
    (a JobSet's pod: its Job, then the JobSet; cached per replica); a reservation or
    Workload the watch has not brought yet means None."""
    m = meta(pod)
    rr_name = str(child(m, "labels").get(L.LABEL_RESERVATION) or "")
    if not rr_name or malformed_gates(pod) is not None or child(pod, "spec").get("nodeName"):
        return None
    # an elastic Job's: its newest
    rr = ctx.store.reservation_view_for_label(namespace, rr_name)
    if rr is None or rr.deleting:
        return None
    workload = ctx.store.workload(rr.workload_key)
    if workload is None:
        return None
    with_ns = {**pod, "metadata": {**m, "namespace": namespace}}
    # a Job's pod is proven the Workload's by its own owner (the Job owns both): no read
    if foreign_reason(with_ns, namespace, rr.raw, workload.raw) is not None:
        chains = ctx.component(WebhookState).owner_chains(ctx)
        await chains.resolve([with_ns])
        ancestors = chains.ancestor_uids(with_ns)
        if foreign_reason(with_ns, namespace, rr.raw, workload.raw, ancestors) is not None:
            return None  # the ungater refuses it and says why, on the pod
    members = ctx.store.pod_views_of_reservation(namespace, rr.name)
    if not rr.live(ctx.clocks.wall(), bound=any(p.node for p in members)):
        return None
    rules = rank_rules(workload)
    now = ctx.clocks.wall()
    # the pod being created is in no store yet: its view is built here, once
    slot = creation_slot(
        rr.slots,
        ranked_pod(PodView.of(with_ns), rr.pod_sets, rules, now=now),
        [ranked_pod(p, rr.pod_sets, rules, now=now) for p in members],
    )
    if (slot is None or failed_node(ctx.store.get("Node", slot.node)) is not None
            or is_displaced(ctx, rr, slot.key, slot.node)):
        return None  # such a slot moves first (`failed_nodes.py`, `displaced.py`); then the
        # ungater pins the pod
    hostname = pinned_hostname(ctx.store.get("Node", slot.node), slot.node)
    selector = child(pod, "spec").get("nodeSelector") or {}
    if selector.get(L.HOSTNAME_LABEL, hostname) != hostname:
        return None  # the pod asks for another host: the ungater's patch would be refused
    return slot, hostname


def pin_ops(pod: Mapping[str, Any], slot: ReservedSlot, hostname: str) -> list[dict[str, Any]]:
    """The JSON patch that pins the pod being created to `slot` and takes our gate off: the
    same fields as the ungater's pin patch (`ungater.pin_patch`), each written whole."""
    m = meta(pod)
    spec = child(pod, "spec")
    ours = L.GATE_PLACEMENT
    gates = [dict(g) for g in spec.get("schedulingGates") or [] if g.get("name") != ours]
    ops: list[dict[str, Any]] = [
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {**(m.get("annotations") or {}), **slot_annotations(slot)},
        },
        {
            "op": "add",
            "path": "/spec/nodeSelector",
            "value": {**(spec.get("nodeSelector") or {}), L.HOSTNAME_LABEL: hostname},
        },
        {
            "op": "add",
            "path": "/spec/schedulingGates",
            "value": gates,
        },
    ]
    terms = node_name_terms(pod, slot.node)
    if terms is not None:
        affinity = spec.get("affinity") or {}
        node_affinity = affinity.get("nodeAffinity") or {}
        required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
        ops.append({
            "op": "add",
            "path": "/spec/affinity",
            "value": {
                **affinity,
                "nodeAffinity": {
                    **node_affinity,
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        **required, "nodeSelectorTerms": terms,
                    },
                },
            },
        })
    return ops


def _allowed(uid: str, patch: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode("ascii")
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


async def creation_pin_ops(
    ctx: Context, pod: Mapping[str, Any], namespace: str
) -> list[dict[str, Any]] | None:
    """`pin_ops` for the slot `creation_pin` finds, counted as `pinned`; None (the pod is
    left to be gated) where it finds none or anything is unreadable."""
    try:
        pin = await creation_pin(ctx, pod, namespace)
        ops = pin_ops(pod, *pin) if pin is not None else None
    except Exception as e:  # anything unreadable: the ungater takes it, as without the hook
        log.debug("no pin at creation for a pod of %s: %s", namespace, e, exc_info=e)
        return None
    if pin is None or ops is None:
        return None
    ctx.metrics.webhook_requests.labels("pinned").inc()
    log.info(
        "pod %s/%s → %s (slot %s) at creation",
        namespace, meta(pod).get("name") or meta(pod).get("generateName"), pin[0].node, pin[0].key,
    )
    return ops


async def answer_pin_review(ctx: Context, review: Mapping[str, Any]) -> dict[str, Any]:
    """Allowed always: with the pin and our gate off when `creation_pin` finds the slot,
    else as it came (gated by the policy; the ungater pins it)."""
    request = review["request"]
    uid = str(request["uid"])
    pod = request["object"]
    if request.get("operation") != "CREATE":
        return _allowed(uid)
    namespace = str(request.get("namespace") or meta(pod).get("namespace") or "default")
    ops = await creation_pin_ops(ctx, pod, namespace)
    if ops is None:
        ctx.metrics.webhook_requests.labels("left-gated").inc()
        return _allowed(uid)
    return _allowed(uid, ops)


async def answer_gate_or_pin_review(ctx: Context, review: Mapping[str, Any]) -> dict[str, Any]:
    """Webhook gate mode (no gate policy: Kubernetes before 1.36) with pin at creation: the
    gate hook's own answer (`webhook.review.answer_review`: a tenant's pod that names
    another Workload's reservation is still denied), except that a pod it would gate gets
    its slot's pin instead where `creation_pin` finds it. The chart does not reinvoke this
    hook; were it called again, it gives the same pin (the pod asks for the slot's host)."""
    return await answer_review(ctx, review, pin=partial(_pin_instead_of_gate, ctx))


async def _pin_instead_of_gate(
    ctx: Context, pod: Mapping[str, Any], namespace: str
) -> list[dict[str, Any]] | None:
    # decided on the pod as the gate would leave it, as under the policy
    gated = {**pod, "spec": {**child(pod, "spec"), "schedulingGates": gated_spec(pod)}}
    return await creation_pin_ops(ctx, gated, namespace)
