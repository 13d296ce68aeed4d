"""The pod webhook: a pod that carries a reservation label may only be created if that
reservation exists in its namespace and belongs to its Workload; such a pod gets our
scheduling gate, so it waits until the ungater gives it a slot. It writes nothing.

Who calls it: `thread.py` answers pod CREATE reviews with `answer_review`; the
MutatingWebhookConfiguration selects only pods with the reservation label, or (where no
gate policy runs) with Kueue's queue label (see `queued_under_check`), so no other pod
ever reaches it. Where
the apiserver gates labelled pods itself (`kube/pod_gate_policy.py`), pods created by the
trusted controllers skip this webhook, and the ungater makes the same ownership check
(`foreign_reason`) before it gives a pod a slot. A tenant who copies another Workload's
label onto a pod is denied with a message that says why.

`decide` is pure; `review_pod` adds the one read the store may not have yet: a reservation
created a moment ago (Kueue unsuspends a Job within milliseconds of our Ready) is fetched
from the API before a pod is denied for lack of it. It runs on the webhook's own thread
(`thread.py`): it reads the store and never writes it there.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from cachetools import TTLCache

from nexus_admit.controller.context import Context
from nexus_admit.controller.pod_owners import OwnerChains, owned_member
from nexus_admit.controller.store import Store
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import child, meta
from nexus_admit.kube.kueue import our_check_names
from nexus_admit.kube.queues import (
    QueueLookup,
    local_queue_cluster_queue,
    pod_queue,
    queue_uses_check,
    suspending_statefulset,
)
from nexus_admit.kube.reservations import reservation_workload_key, reservation_workload_uid

# a name the apiserver just said does not exist is not asked again for this long: a flood
# of pod reviews naming made-up queues or reservations costs one GET per name, not per pod
WEBHOOK_MISS_SECONDS = 2.0


def _misses() -> TTLCache[tuple[str, str, str], bool]:
    return TTLCache(maxsize=4096, ttl=WEBHOOK_MISS_SECONDS)


@dataclass
class WebhookState:
    """The webhook's caches, used on its own loop only (neither is thread-safe): the names
    the apiserver just answered NotFound, (kind, namespace, name), and the owners above
    pods (`pod_owners.py`)."""

    misses: TTLCache[tuple[str, str, str], bool] = field(default_factory=_misses)
    chains: OwnerChains | None = None

    def owner_chains(self, ctx: Context) -> OwnerChains:
        if self.chains is None:
            self.chains = OwnerChains(ctx.read_owner)
        return self.chains

    def reset(self) -> None:
        # new objects, not cleared ones: the main loop resets while the webhook's thread reads
        self.misses, self.chains = _misses(), None


__all__ = [
    "GateAnswer",
    "Pin",
    "answer_review",
    "decide",
    "foreign_reason",
    "gate_patch",
    "gated_spec",
    "malformed_gates",
    "pod_ref",
    "queued_under_check",
    "review_pod",
]


@dataclass(frozen=True, slots=True)
class GateAnswer:
    allowed: bool
    message: str = ""
    add_gate: bool = False


def _gate_names(pod: Mapping[str, Any]) -> list[str]:
    gates = child(pod, "spec").get("schedulingGates")
    return (
        [str(g.get("name")) for g in gates if isinstance(g, Mapping)]
        if isinstance(gates, list)
        else []
    )


def pod_ref(pod: Mapping[str, Any], namespace: str) -> str:
    """'Pod namespace/name' for messages; a pod created with generateName has no name yet."""
    m = meta(pod)
    name = m.get("name") or (f"{m.get('generateName')}<generated>" if m.get("generateName") else "")
    return f"Pod {namespace}/{name or '<unnamed>'}"


def malformed_gates(pod: Mapping[str, Any]) -> str | None:
    """Why the pod's scheduling gates cannot take ours, or None. The apiserver would refuse
    such a pod anyway; saying so here keeps our patch from building on junk."""
    gates = child(pod, "spec").get("schedulingGates")
    if gates is None:
        return None
    if not isinstance(gates, list) or not all(
        isinstance(g, Mapping) and isinstance(g.get("name"), str) for g in gates
    ):
        return "spec.schedulingGates must be a list of {name: <string>} entries"
    return None


def gated_spec(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's scheduling gates with ours added (its gates are well-formed: see
    `malformed_gates`)."""
    gates = [dict(g) for g in child(pod, "spec").get("schedulingGates") or []]
    return [*gates, {"name": L.GATE_PLACEMENT}]


def foreign_reason(
    pod: Mapping[str, Any],
    namespace: str,
    reservation: Mapping[str, Any] | None,
    workload: Mapping[str, Any] | None,
    ancestors: Collection[str] = (),
) -> str | None:
    """Why the pod may not use the reservation its label names, or None when it may: the
    reservation must exist in its namespace and belong to a live Workload the pod is part
    of by its owners (`ancestors`: the uids above its own owners,
    `controller/pod_owners.py`). The webhook denies such a pod; the ungater never gives it
    a slot (a pod created by a trusted controller is gated in the apiserver and reaches only
    the ungater)."""
    rr_name = str(child(meta(pod), "labels").get(L.LABEL_RESERVATION) or "")
    if reservation is None:
        return (
            f"ResourceReservation {namespace}/{rr_name} named by the pod label "
            f"{L.LABEL_RESERVATION} does not exist; nexus-admit sets that label through Kueue, "
            "remove it from the pod"
        )
    if workload is None or (
        reservation_workload_uid(reservation)
        and reservation_workload_uid(reservation) != meta(workload).get("uid")
    ):
        return (
            f"ResourceReservation {namespace}/{rr_name} named by the pod label "
            f"{L.LABEL_RESERVATION} belongs to Workload "
            f"{reservation_workload_key(reservation)}, which no longer exists"
        )
    if not owned_member(pod, workload, ancestors):
        return (
            f"the pod is not part of Workload {reservation_workload_key(reservation)}, which "
            f"ResourceReservation {namespace}/{rr_name} (pod label {L.LABEL_RESERVATION}) "
            "belongs to: none of the objects above the pod owns that Workload, and a label "
            "or annotation naming it is no proof; a pod cannot use another Workload's "
            "reservation"
        )
    return None


def decide(
    pod: Mapping[str, Any],
    namespace: str,
    reservation: Mapping[str, Any] | None,
    workload: Mapping[str, Any] | None,
    ancestors: Collection[str] = (),
) -> GateAnswer:
    if not child(meta(pod), "labels").get(L.LABEL_RESERVATION):
        return GateAnswer(True)
    foreign = foreign_reason(pod, namespace, reservation, workload, ancestors)
    if foreign is not None:
        return GateAnswer(False, foreign)
    if child(pod, "spec").get("nodeName"):
        return GateAnswer(False, "a pod with a reservation label must not set spec.nodeName")
    return GateAnswer(True, add_gate=L.GATE_PLACEMENT not in _gate_names(pod))


Lookup = QueueLookup  # (kind, key) → object


def queued_under_check(
    pod: Mapping[str, Any], namespace: str, store: Store | Lookup, checks: Collection[str]
) -> bool:
    """A pod queued in a LocalQueue whose ClusterQueue lists one of our checks, whoever
    creates it (a tenant, a ReplicaSet, a StatefulSet...). Kueue adds the reservation label
    to such pods only when it lifts its own admission gate, by an update, and a gate cannot
    be added after creation: so they get ours at creation, and the ungater lifts it. A pod
    of any other queue, or of a queue that is missing or malformed, is never gated."""
    get = store.get if isinstance(store, Store) else store
    return queue_uses_check(namespace, pod_queue(pod), get, checks)


async def _statefulset_queue(ctx: Context, pod: Mapping[str, Any], namespace: str) -> str:
    """The queue of the StatefulSet Kueue suspends this pod through ("" for other pods):
    such a pod is created without the queue label (`kube/queues.py`)."""
    name = suspending_statefulset(pod)
    if not name:
        return ""
    sts = ctx.store.get("StatefulSet", f"{namespace}/{name}")
    if sts is None:
        sts = await fetch(ctx, "StatefulSet", name, namespace)
    return pod_queue(sts) if sts is not None else ""


async def _fill_queue(ctx: Context, queue: str, namespace: str) -> Lookup:
    """The store, with the LocalQueue `queue` and its ClusterQueue fetched when the watch
    has not brought them yet (a queue created a moment before its first pod). What was
    fetched goes to the store through its own loop: this runs on the webhook's thread."""
    fetched: dict[tuple[str, str], Mapping[str, Any]] = {}

    def lookup(kind: str, key: str) -> Mapping[str, Any] | None:
        return fetched.get((kind, key)) or ctx.store.get(kind, key)

    def keep(kind: str, key: str, obj: Mapping[str, Any]) -> None:
        fetched[(kind, key)] = {"kind": kind, **obj}
        ctx.call_in_loop(ctx.store.upsert, kind, fetched[(kind, key)])

    if not queue:
        return lookup
    lq = lookup("LocalQueue", f"{namespace}/{queue}")
    if lq is None:
        lq = await fetch(ctx, "LocalQueue", queue, namespace)
        if lq is None:
            return lookup
        keep("LocalQueue", f"{namespace}/{queue}", lq)
    cq_name = local_queue_cluster_queue(lq)
    if cq_name and lookup("ClusterQueue", cq_name) is None:
        cq = await fetch(ctx, "ClusterQueue", cq_name)
        if cq is not None:
            keep("ClusterQueue", cq_name, cq)
    return lookup


async def fetch(
    ctx: Context, kind: str, name: str, namespace: str | None = None
) -> dict[str, Any] | None:
    """A GET the watch has not answered yet, with misses remembered for a moment
    (`WebhookState.misses`; the webhook's own loop only)."""
    key, misses = (kind, namespace or "", name), ctx.component(WebhookState).misses
    if key in misses:
        return None
    found = await asyncio.to_thread(ctx.api.get, kind, name, namespace)
    if found is None:
        misses[key] = True
    return found


async def review_pod(ctx: Context, pod: Mapping[str, Any], namespace: str) -> GateAnswer:
    malformed = malformed_gates(pod)
    if malformed is not None:
        ctx.metrics.webhook_requests.labels("denied").inc()
        return GateAnswer(False, malformed)
    rr_name = str(child(meta(pod), "labels").get(L.LABEL_RESERVATION) or "")
    if not rr_name:
        queue = pod_queue(pod) or await _statefulset_queue(ctx, pod, namespace)
        lookup = await _fill_queue(ctx, queue, namespace)
        # our checks as the store shows them, not ctx.checks: that is refreshed by the
        # loop's passes, which only the leader runs, and every replica serves the webhook
        ours = our_check_names(ctx.store.items("AdmissionCheck"))
        if queue_uses_check(namespace, queue, lookup, ours):
            gates = _gate_names(pod)
            ctx.metrics.webhook_requests.labels("gated").inc()
            return GateAnswer(True, add_gate=L.GATE_PLACEMENT not in gates)
        return GateAnswer(True)
    rr = ctx.store.reservation_for_label(namespace, rr_name)  # an elastic Job's: its newest
    if rr is None:
        rr = await fetch(ctx, L.KIND_RESOURCE_RESERVATION, rr_name, namespace)
    workload = None
    if rr is not None:
        key = reservation_workload_key(rr)
        workload = ctx.store.get("Workload", key)
        if workload is None:
            ns, _, name = key.partition("/")
            workload = await fetch(ctx, "Workload", name, ns)
    ancestors: set[str] = set()
    if workload is not None:
        pod_with_ns = {**pod, "metadata": {**meta(pod), "namespace": namespace}}
        chains = ctx.component(WebhookState).owner_chains(ctx)
        await chains.resolve([pod_with_ns])
        ancestors = chains.ancestor_uids(pod_with_ns)
    answer = decide(pod, namespace, rr, workload, ancestors)
    ctx.metrics.webhook_requests.labels("gated" if answer.allowed else "denied").inc()
    return answer


REVIEW_API_VERSION = "admission.k8s.io/v1"


def _review(uid: str, response: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": REVIEW_API_VERSION,
        "kind": "AdmissionReview",
        "response": {"uid": uid, **response},
    }


def gate_patch(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that adds our gate to the pod's (well-formed) scheduling gates."""
    if not isinstance(pod.get("spec"), Mapping):
        return [{"op": "add", "path": "/spec", "value": {"schedulingGates": gated_spec(pod)}}]
    return [{"op": "add", "path": "/spec/schedulingGates", "value": gated_spec(pod)}]


# (pod, namespace) → the JSON patch that pins the pod instead of gating it, or None
Pin = Callable[[Mapping[str, Any], str], Awaitable[list[dict[str, Any]] | None]]


async def answer_review(
    ctx: Context, review: Mapping[str, Any], pin: Pin | None = None
) -> dict[str, Any]:
    """The AdmissionReview response to a pod review that `server.review_problem`
    passed: allowed, allowed with our gate added (a JSON patch), or denied with a message
    that starts with the pod and says why. Only CREATE is gated; an UPDATE passes. `pin`
    (webhook gate mode with pin at creation, `ungating/at_creation.py`): a pod with a
    reservation label that would be gated gets `pin`'s patch instead where it gives one."""
    request = review["request"]
    uid = str(request["uid"])
    pod = request["object"]
    namespace = str(request.get("namespace") or meta(pod).get("namespace") or "default")
    if request.get("operation") != "CREATE":
        return _review(uid, {"allowed": True})
    try:
        answer = await review_pod(ctx, pod, namespace)
    except Exception as e:  # the API behind a lookup failed: the creator retries
        ctx.metrics.webhook_requests.labels("error").inc()
        message = f"{pod_ref(pod, namespace)}: could not check its reservation label: {e}"
        return _review(uid, {"allowed": False, "status": {"code": 503, "message": message}})
    if not answer.allowed:
        message = f"{pod_ref(pod, namespace)}: {answer.message}"
        return _review(uid, {"allowed": False, "status": {"code": 403, "message": message}})
    if not answer.add_gate:
        return _review(uid, {"allowed": True})
    ops = None
    if pin is not None and child(meta(pod), "labels").get(L.LABEL_RESERVATION):
        ops = await pin(pod, namespace)
    patch = base64.b64encode(json.dumps(ops or gate_patch(pod)).encode()).decode("ascii")
    return _review(uid, {"allowed": True, "patchType": "JSONPatch", "patch": patch})
