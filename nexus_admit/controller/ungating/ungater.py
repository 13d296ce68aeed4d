"""Pins gated pods to their slots and lifts the gate, so kube-scheduler binds them there.

Who calls it: `operator.py` runs `run_ungater` as a task of its own, woken by pod and
reservation events, apart from the placing loop (in a burst, a pod waited behind every
solve of the pass before; 240 s p50 on the load benchmark). For each live reservation with
pods that still carry our scheduling gate, the pure `assign_slots` chooses their slots, and
one strategic-merge patch per pod adds the hostname nodeSelector, the node's name to its
required node affinity (so kube-scheduler filters that node alone) and the slot / NUMA-zone
annotations, and drops the gate (Kubernetes accepts both additions on a gated pod). The
patches go out concurrently; the reservation's status is rewritten by `lifecycle.py`, not
per pod.

The slots a pod holds are read back from the pods themselves, so a restart needs no
memory; its claims (`UngaterState`) only cover our own patches until the watch shows
them, so a pass in between does not hand the same slot out twice (Kueue TAS's ungater keeps
the same kind of expectations).

Only a pod that is part of the reservation's Workload gets a slot (`webhook/review.foreign_reason`):
pods created by trusted controllers (the Job controller) are gated in the apiserver by a
MutatingAdmissionPolicy and never reach the webhook, so a Job template that copies another
Workload's reservation label yields pods that stay gated here, with a Warning Event on each
that says why. Such a pod holds no slot, even if it claims one in its annotations.

Failures stay with their object: a gated pod the pass cannot read is left gated, and a
reservation whose pods cannot be read is left for the next pass, each counted and told once
(`skipped.report_skipped`: an Event on the pod, or on the reservation's Workload); every
other gang is ungated as usual. The pass reads the store's views of pods and reservations
(`kube/views.py`), and their objects (`raw`) only for the owner checks and the patches it
writes. Claims are written only for a reservation whose slots were
all chosen, and a pass that fails takes back the claims whose patches it did not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from nexus_admit.controller.context import Context
from nexus_admit.controller.displaced import is_displaced
from nexus_admit.controller.events import post_event
from nexus_admit.controller.pod_owners import owned_member
from nexus_admit.controller.reservation_pods import failed_node
from nexus_admit.controller.skipped import report_skipped
from nexus_admit.controller.tasks import gather_bounded
from nexus_admit.controller.ungater_state import UngaterState
from nexus_admit.controller.ungating.replacements import tell_waiting
from nexus_admit.controller.ungating.slot_assignment import (
    RankedPod,
    assign_slots,
    rank_rules,
    ranked_pod,
)
from nexus_admit.controller.webhook.review import foreign_reason
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import Skipped, meta
from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.reservations import ReservedSlot
from nexus_admit.kube.views import UNREADABLE, PodView, ReservationView

__all__ = [
    "UngaterState",
    "node_name_terms",
    "pin_patch",
    "pinned_hostname",
    "run_ungater",
    "slot_annotations",
    "sync_ungating",
]

log = logging.getLogger(__name__)


def _claims(ctx: Context) -> dict[str, str]:
    return ctx.component(UngaterState).claims


def node_name_terms(pod: Mapping[str, Any], node: str) -> list[dict[str, Any]] | None:
    """The pod's required node-affinity terms, each also requiring the node's name
    (`metadata.name`), or None when a term cannot take it.

    Why: with a hostname nodeSelector alone, kube-scheduler filters every node of the fleet
    to find the one that fits (5,000 at a time on the load benchmark); a node name in every
    term lets its NodeAffinity PreFilter hand it that one node, as for a DaemonSet's pod. A
    gated pod's terms may only grow (each keeps its requirements, in order, and takes more):
    an empty term, which no node matches anyway, cannot, and a term that is not a mapping
    is the apiserver's to refuse; then the nodeSelector alone pins the pod."""
    want = {"key": "metadata.name", "operator": "In", "values": [node]}
    spec = pod.get("spec")
    affinity = spec.get("affinity") if isinstance(spec, Mapping) else None
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = (node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
                if isinstance(node_affinity, Mapping) else None)
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if not terms:
        return [{"matchFields": [want]}]
    if not isinstance(terms, list):
        return None
    out = []
    for term in terms:
        if not isinstance(term, Mapping):
            return None
        fields = term.get("matchFields") or []
        if not isinstance(fields, list) or not (term.get("matchExpressions") or fields):
            return None
        # a term that already requires the node keeps it once (a webhook reinvoked)
        out.append({**term, "matchFields": fields if want in fields else [*fields, want]})
    return out


def pin_patch(
    slot: ReservedSlot, hostname: str, terms: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The one patch that pins a gated pod to its slot and lifts our gate: the hostname
    nodeSelector (what `kubectl describe pod` shows), and `terms` (`node_name_terms`) as
    its required node affinity, so the scheduler looks at that node alone."""
    spec: dict[str, Any] = {
        "nodeSelector": {L.HOSTNAME_LABEL: hostname},
        "schedulingGates": [{"$patch": "delete", "name": L.GATE_PLACEMENT}],
    }
    if terms is not None:
        # nodeSelectorTerms has no merge key: the patch carries the whole list
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}
    return {"metadata": {"annotations": slot_annotations(slot)}, "spec": spec}


def slot_annotations(slot: ReservedSlot) -> dict[str, str]:
    """The annotations that say which slot (and NUMA zone) a pinned pod holds."""
    annotations = {L.ANN_SLOT: slot.key}
    if slot.numa_zone is not None:
        annotations[L.ANN_NUMA_ZONE] = str(slot.numa_zone)
    return annotations


def pinned_hostname(node: Mapping[str, Any] | None, name: str) -> str:
    """The value of the hostname nodeSelector that pins a pod to the node `name` (its
    hostname label, which may differ from its name)."""
    labels = (meta(node).get("labels") or {}) if node else {}
    return str(labels.get(L.HOSTNAME_LABEL) or name)


def _ranked(
    ctx: Context,
    pods: Sequence[PodView],
    rr: ReservationView,
    skipped: list[Skipped],
) -> list[RankedPod]:
    rules = rank_rules(ctx.store.workload(rr.workload_key))
    now = ctx.clocks.wall()
    out = []
    for p in pods:
        try:
            ranked = ranked_pod(p, rr.pod_sets, rules, now=now)
        except Exception as e:
            _skip_gated_pod(p, e, skipped)  # a pod off the gate may hold a slot: raises
            continue
        if ranked.slot is not None or not ranked.gated:
            _claims(ctx).pop(p.uid, None)  # the watch shows our patch
        elif p.uid in _claims(ctx):
            continue  # patched, not yet seen: its slot is held by the assumption below
        out.append(ranked)
    return out


KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"


def unpinned_release(pod: PodView) -> bool:
    """A plain pod gated by the webhook (its queue uses our check) that Kueue admitted
    without a reservation label (a TAS flavor: Kueue chose its host): lift our gate only."""
    return pod.gated and KUEUE_ADMISSION_GATE not in pod.gates and not pod.reservation


async def run_ungater(ctx: Context) -> None:
    """Run an ungating pass whenever a pod or a reservation changed, and every tick. Apart
    from the placing loop (`loop.cycle.run_loop`): a gated pod's wait is the round trip of its
    own patch, never the solves queued ahead of it in a burst."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ctx.signals.ungate_wake.wait(), timeout=ctx.options.tick_seconds)
        ctx.signals.ungate_wake.clear()
        if not ctx.leadership.synced or not ctx.acting():
            continue  # a follower patches nothing
        # a task of its own, so losing the lease can cancel it mid-way
        state = ctx.component(UngaterState)
        task = state.task = asyncio.create_task(sync_ungating(ctx, wait=False),
                                                name="ungating-pass")
        await asyncio.wait({task})
        state.task = None
        if task.cancelled():
            continue
        if task.exception() is not None:  # one bad pass must not stop the ungater
            ctx.metrics.errors.labels("ungate").inc()
            log.error(
                "ungating pass failed; retrying on the next event or tick",
                exc_info=task.exception(),
            )


# pin patches in flight at once: the pods of a gang are created together and each waits for
# its own patch (the client keeps `api.API_THREADS` connections)
UNGATE_CONCURRENCY = 16


async def sync_ungating(ctx: Context, *, wait: bool = True) -> None:
    """Give every gated pod of a live reservation its slot, and lift our gate from plain
    pods admitted without one. Reads the store's index of gated pods only, so a pass costs
    what is waiting, not the size of the cluster. `wait`: await the patches (tests); the
    ungater's loop does not, so a pod created while a gang's patches are in flight gets
    its own at once instead of after the whole batch (its claim keeps the next pass off)."""
    await _resolve_owners(ctx)
    gated = ctx.store.gated_pod_views()
    # a claim is needed only while the store still shows the pod gated (its patch in
    # flight or failed); once the watch shows it ungated, its pin says which slot it has.
    # Kept for every pod ever patched, this walk grew with the cluster, on every pod event
    still_gated = {p.uid for p in gated}
    state = ctx.component(UngaterState)
    state.claims = {u: s for u, s in state.claims.items() if u in still_gated}
    ctx.component(UngaterState).refused &= still_gated
    if not gated:
        return
    skipped: list[Skipped] = []
    claimed: list[str] = []  # uids claimed by this pass, taken back if it fails
    writes: list[Coroutine[Any, Any, None]] = []
    try:
        for pod in gated:
            if unpinned_release(pod) and pod.uid not in _claims(ctx):
                _claims(ctx)[pod.uid] = ""  # claimed now: the patch may start after the next pass
                claimed.append(pod.uid)
                writes.append(_lift(ctx, pod))
        reservations: dict[tuple[str, str], None] = {}  # in pod order, once each
        for pod in gated:
            if pod.reservation:
                reservations[(pod.namespace, pod.reservation)] = None
        seen: set[str] = set()
        for ns, name in reservations:
            # an elastic Job's pods keep the first slice's label: the newest slice's holds them
            rr = ctx.store.reservation_view_for_label(ns, name)
            if rr is None or rr.deleting:
                continue  # not seen yet (the next event brings it), or being released
            if rr.key in seen:
                continue
            seen.add(rr.key)
            try:
                chosen = _choose(ctx, ns, rr, skipped)
            except Exception as e:  # this reservation waits; every other gang goes on
                skipped.append(_skipped_reservation(rr, e))
                continue
            # claim the slots now: the patches below run concurrently with the next pass
            for member, slot in chosen:
                _claims(ctx)[member.uid] = slot.key
                claimed.append(member.uid)
                writes.append(_pin(ctx, member, slot))
    except BaseException:
        for uid in claimed:  # no patch started: nothing may keep these pods from a slot
            _claims(ctx).pop(uid, None)
        for w in writes:
            w.close()
        raise
    finally:
        report_skipped(ctx, skipped, action="Ungate")
    if wait:
        await gather_bounded(writes, UNGATE_CONCURRENCY)
        return
    for patch in writes:
        ctx.component(UngaterState).writes.spawn(patch, name="pin-patch")


async def _resolve_owners(ctx: Context) -> None:
    """Read the owners above every pod of the reservations that gated pods wait for
    (membership needs them: `pod_owners.owned_member`); cached, so a pass after the first
    reads only new owners."""
    pods: dict[str, PodView] = {}
    for pod in ctx.store.gated_pod_views():
        pods[pod.uid] = pod
        if pod.reservation:
            for member in ctx.store.pod_views_of_reservation(pod.namespace, pod.reservation):
                pods[member.uid] = member
    unproven = [p.raw for p in pods.values() if not _member_by_own_owners(ctx, p)]
    if unproven:
        await ctx.component(UngaterState).owner_chains(ctx).resolve(unproven)


def _member_by_own_owners(ctx: Context, pod: PodView) -> bool:
    """A pod its own owner references already prove part of its reservation's Workload (a
    Job's pod: the Job owns both), so no owner above it need be read: a GET per Job saved."""
    try:
        if not pod.reservation:
            return False
        rr = ctx.store.reservation_view_for_label(pod.namespace, pod.reservation)
        workload = ctx.store.workload(rr.workload_key) if rr else None
        return workload is not None and owned_member(pod.raw, workload.raw)
    except Exception:  # malformed: its owners are read, and `_members` reports it
        return False


def _choose(
    ctx: Context, namespace: str, rr: ReservationView, skipped: list[Skipped]
) -> list[tuple[PodView, ReservedSlot]]:
    """(pod, slot) for every gated member of the reservation that can get a slot now."""
    pods = _members(ctx, namespace, rr, skipped)
    if not rr.live(ctx.clocks.wall(), bound=any(p.node for p in pods)):
        return []  # past its TTL before any pod bound: the lifecycle releases it
    ranked = _ranked(ctx, pods, rr, skipped)
    uids = {p.uid for p in pods}
    taken = {slot for uid, slot in _claims(ctx).items() if uid in uids}
    # never a slot whose node failed or has no room left for it: the lifecycle moves it
    # first (`failed_nodes.py`, `displaced.py`)
    slots = [s for s in rr.slots if s.key not in taken
             and failed_node(ctx.store.get("Node", s.node)) is None
             and not is_displaced(ctx, rr, s.key, s.node)]
    chosen = assign_slots(slots, ranked)
    tell_waiting(ctx, pods, ranked, chosen)
    by_name = {p.name: p for p in pods}
    return [(by_name[pod_name], slot) for pod_name, slot in chosen.items()]


def _skip_gated_pod(pod: PodView, error: Exception, skipped: list[Skipped]) -> None:
    """Leave a gated pod the pass cannot read out of it (it holds no slot yet). Any other
    pod may hold a slot, so its reservation is left out instead: `error` is raised again."""
    if not pod.gated:
        raise error
    log.debug("gated pod %s left out", pod.key, exc_info=error)
    skipped.append(
        Skipped.of(pod.raw, "Pod", "", UNREADABLE, f"cannot be ungated: {_describe(error)}")
    )


def _skipped_reservation(rr: ReservationView, error: Exception) -> Skipped:
    log.debug("reservation %s left out of ungating", rr.name, exc_info=error)
    return Skipped.of(
        rr.raw,
        L.KIND_RESOURCE_RESERVATION,
        "",
        UNREADABLE,
        f"its gated pods cannot get slots: {_describe(error)}",
        owner=f"Workload {rr.workload_key}",
    )


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def _members(
    ctx: Context, namespace: str, rr: ReservationView, skipped: list[Skipped]
) -> list[PodView]:
    """The pods with the reservation's label that are part of its Workload. Any other pod
    with that label is refused once, with a Warning Event on it, and left gated. (The owner
    check reads the objects, `raw`: it translates their owner references.)"""
    workload = ctx.store.workload(rr.workload_key)
    members: list[PodView] = []
    for pod in ctx.store.pod_views_of_reservation(namespace, rr.name):
        try:
            ancestors = ctx.component(UngaterState).owner_chains(ctx).ancestor_uids(pod.raw)
            reason = foreign_reason(pod.raw, namespace, rr.raw,
                                    workload.raw if workload else None, ancestors)
        except Exception as e:
            _skip_gated_pod(pod, e, skipped)
            continue
        if reason is None:
            members.append(pod)
            continue
        if pod.gated and pod.uid not in ctx.component(UngaterState).refused:
            ctx.component(UngaterState).refused.add(pod.uid)
            ctx.metrics.errors.labels("foreign-pod").inc()
            log.warning("pod %s/%s stays gated: %s", namespace, pod.name, reason)
            ctx.workers.background.spawn(
                asyncio.to_thread(
                    post_event,
                    ctx.api,
                    {"apiVersion": "v1", "kind": "Pod", **pod.raw},
                    "PlacementDenied",
                    f"not ungated: {reason}",
                    event_type="Warning",
                    now=ctx.clocks.wall(),
                    action="Ungate",
                ),
                name="refused-pod-event",
            )
    return members


async def _lift(ctx: Context, pod: PodView) -> None:
    patch = {"spec": {"schedulingGates": [{"$patch": "delete", "name": L.GATE_PLACEMENT}]}}
    try:
        await asyncio.to_thread(ctx.api.patch_pod, pod.name, pod.namespace, patch)
    except asyncio.CancelledError:  # this replica stops acting: no claim may outlive it
        _claims(ctx).pop(pod.uid, None)
        raise
    except Exception as e:
        _claims(ctx).pop(pod.uid, None)
        ctx.metrics.errors.labels("ungate").inc()
        log.warning("could not lift the gate of %s: %s", pod.key, e)


async def _pin(ctx: Context, pod: PodView, slot: ReservedSlot) -> None:
    hostname = pinned_hostname(ctx.store.get("Node", slot.node), slot.node)
    uid = pod.uid
    _claims(ctx)[uid] = slot.key
    # before the patch goes out: a pass's patches run concurrently, so after one returned
    # the others may all have landed; here this pod, at least, is still gated
    ctx.faults.hit("kill-while-ungating")
    try:
        await asyncio.to_thread(
            ctx.api.patch_pod,
            pod.name,
            pod.namespace,
            pin_patch(slot, hostname, node_name_terms(pod.raw, slot.node)),
        )
    except asyncio.CancelledError:  # this replica stops acting: no claim may outlive it
        _claims(ctx).pop(uid, None)
        raise
    except Exception as e:  # the pod stays gated; the next pass tries again
        _claims(ctx).pop(uid, None)
        ctx.metrics.errors.labels("ungate").inc()
        log.warning("could not pin pod %s to %s: %s", pod.key, slot.node, e)
        return
    created = parse_time(meta(pod.raw).get("creationTimestamp"))
    if created is not None:
        ctx.metrics.ungate_seconds.observe(max(0.0, (ctx.clocks.wall() - created).total_seconds()))
    log.info("pod %s → %s (slot %s)", pod.key, slot.node, slot.key)
