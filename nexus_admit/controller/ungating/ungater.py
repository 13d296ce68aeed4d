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
other gang is ungated as usual. Claims are written only for a reservation whose slots were
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
    PodView,
    assign_slots,
    pod_view,
    rank_rules,
)
from nexus_admit.controller.webhook.review import foreign_reason
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import Skipped, child, meta, object_key
from nexus_admit.kube.quantity import parse_time
from nexus_admit.kube.reservations import (
    ReservedSlot,
    reservation_is_live,
    reservation_slots,
    reservation_workload_key,
)

__all__ = [
    "UngaterState",
    "node_name_terms",
    "pin_patch",
    "pinned_hostname",
    "pod_set_names",
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


def pod_set_names(rr: Mapping[str, Any]) -> list[str]:
    """The names of the reservation's pod sets, in its order."""
    spec = child(rr, "spec")
    return [str(ps.get("name")) for ps in spec.get("podSets") or [] if isinstance(ps, Mapping)]


def _views(
    ctx: Context,
    pods: Sequence[Mapping[str, Any]],
    rr: Mapping[str, Any],
    skipped: list[Skipped],
) -> list[PodView]:
    rules = rank_rules(ctx.store.get("Workload", reservation_workload_key(rr)))
    now = ctx.clocks.wall()
    out = []
    for p in pods:
        try:
            view = pod_view(p, pod_set_names(rr), rules, now=now)
        except Exception as e:
            _skip_gated_pod(p, e, skipped)  # a pod off the gate may hold a slot: raises
            continue
        uid = str(meta(p).get("uid") or "")
        if view.slot is not None or not view.gated:
            _claims(ctx).pop(uid, None)  # the watch shows our patch
        elif uid in _claims(ctx):
            continue  # patched, not yet seen: its slot is held by the assumption below
        out.append(view)
    return out


KUEUE_ADMISSION_GATE = "kueue.x-k8s.io/admission"


def unpinned_release(pod: Mapping[str, Any]) -> bool:
    """A plain pod gated by the webhook (its queue uses our check) that Kueue admitted
    without a reservation label (a TAS flavor: Kueue chose its host): lift our gate only."""
    labels = meta(pod).get("labels") or {}
    gates = _gates(pod)
    return (
        L.GATE_PLACEMENT in gates
        and KUEUE_ADMISSION_GATE not in gates
        and not labels.get(L.LABEL_RESERVATION)
    )


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
    gated = ctx.store.gated_pods()
    # a claim is needed only while the store still shows the pod gated (its patch in
    # flight or failed); once the watch shows it ungated, its pin says which slot it has.
    # Kept for every pod ever patched, this walk grew with the cluster, on every pod event
    still_gated = {str(meta(p).get("uid")) for p in gated}
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
            uid = str(meta(pod).get("uid"))
            try:
                release = unpinned_release(pod) and uid not in _claims(ctx)
            except Exception as e:
                _skip_gated_pod(pod, e, skipped)
                continue
            if release:
                _claims(ctx)[uid] = ""  # claimed now: the patch may start after the next pass
                claimed.append(uid)
                writes.append(_lift(ctx, pod))
        reservations: dict[tuple[str, str], None] = {}  # in pod order, once each
        for pod in gated:
            name = child(meta(pod), "labels").get(L.LABEL_RESERVATION)
            if name:
                reservations[(str(meta(pod).get("namespace")), str(name))] = None
        seen: set[str] = set()
        for ns, name in reservations:
            # an elastic Job's pods keep the first slice's label: the newest slice's holds them
            rr = ctx.store.reservation_for_label(ns, name)
            if rr is None or meta(rr).get("deletionTimestamp"):
                continue  # not seen yet (the next event brings it), or being released
            if object_key(rr) in seen:
                continue
            seen.add(object_key(rr))
            try:
                chosen = _choose(ctx, ns, rr, skipped)
            except Exception as e:  # this reservation waits; every other gang goes on
                skipped.append(_skipped_reservation(rr, e))
                continue
            # claim the slots now: the patches below run concurrently with the next pass
            for member, slot in chosen:
                uid = str(meta(member).get("uid") or "")
                _claims(ctx)[uid] = slot.key
                claimed.append(uid)
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
    pods: dict[str, Mapping[str, Any]] = {}
    for pod in ctx.store.gated_pods():
        pods[str(meta(pod).get("uid"))] = pod
        name = child(meta(pod), "labels").get(L.LABEL_RESERVATION)
        if name:
            ns = str(meta(pod).get("namespace"))
            for member in ctx.store.pods_of_reservation(ns, str(name)):
                pods[str(meta(member).get("uid"))] = member
    unproven = [p for p in pods.values() if not _member_by_own_owners(ctx, p)]
    if unproven:
        await ctx.component(UngaterState).owner_chains(ctx).resolve(unproven)


def _member_by_own_owners(ctx: Context, pod: Mapping[str, Any]) -> bool:
    """A pod its own owner references already prove part of its reservation's Workload (a
    Job's pod: the Job owns both), so no owner above it need be read: a GET per Job saved."""
    try:
        m = meta(pod)
        name = child(m, "labels").get(L.LABEL_RESERVATION)
        if not name:
            return False
        rr = ctx.store.reservation_for_label(str(m.get("namespace")), str(name))
        workload = ctx.store.get("Workload", reservation_workload_key(rr)) if rr else None
        return workload is not None and owned_member(pod, workload)
    except Exception:  # malformed: its owners are read, and `_members` reports it
        return False


def _choose(
    ctx: Context, namespace: str, rr: Mapping[str, Any], skipped: list[Skipped]
) -> list[tuple[Mapping[str, Any], ReservedSlot]]:
    """(pod, slot) for every gated member of the reservation that can get a slot now."""
    pods = _members(ctx, namespace, rr, skipped)
    bound = any(child(p, "spec").get("nodeName") for p in pods)
    if not reservation_is_live(rr, ctx.clocks.wall(), bound=bound):
        return []  # past its TTL before any pod bound: the lifecycle releases it
    views = _views(ctx, pods, rr, skipped)
    uids = {str(meta(p).get("uid")) for p in pods}
    taken = {slot for uid, slot in _claims(ctx).items() if uid in uids}
    # never a slot whose node failed or has no room left for it: the lifecycle moves it
    # first (`failed_nodes.py`, `displaced.py`)
    slots = [s for s in reservation_slots(rr) if s.key not in taken
             and failed_node(ctx.store.get("Node", s.node)) is None
             and not is_displaced(ctx, rr, s.key, s.node)]
    chosen = assign_slots(slots, views)
    tell_waiting(ctx, pods, views, chosen)
    by_name = {str(meta(p).get("name")): p for p in pods}
    return [(by_name[pod_name], slot) for pod_name, slot in chosen.items()]


_UNREADABLE = "unreadable"


def _skip_gated_pod(pod: Mapping[str, Any], error: Exception, skipped: list[Skipped]) -> None:
    """Leave a gated pod the pass cannot read out of it (it holds no slot yet). Any other
    pod may hold a slot, so its reservation is left out instead: `error` is raised again."""
    if L.GATE_PLACEMENT not in _gates(pod):
        raise error
    log.debug(
        "gated pod %s/%s left out",
        meta(pod).get("namespace"),
        meta(pod).get("name"),
        exc_info=error,
    )
    skipped.append(
        Skipped.of(pod, "Pod", "", _UNREADABLE, f"cannot be ungated: {_describe(error)}")
    )


def _skipped_reservation(rr: Mapping[str, Any], error: Exception) -> Skipped:
    log.debug("reservation %s left out of ungating", meta(rr).get("name"), exc_info=error)
    return Skipped.of(
        rr,
        L.KIND_RESOURCE_RESERVATION,
        "",
        _UNREADABLE,
        f"its gated pods cannot get slots: {_describe(error)}",
        owner=f"Workload {reservation_workload_key(rr)}",
    )


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def _members(
    ctx: Context, namespace: str, rr: Mapping[str, Any], skipped: list[Skipped]
) -> list[Mapping[str, Any]]:
    """The pods with the reservation's label that are part of its Workload. Any other pod
    with that label is refused once, with a Warning Event on it, and left gated."""
    workload = ctx.store.get("Workload", reservation_workload_key(rr))
    members: list[Mapping[str, Any]] = []
    for pod in ctx.store.pods_of_reservation(namespace, str(meta(rr).get("name"))):
        try:
            ancestors = ctx.component(UngaterState).owner_chains(ctx).ancestor_uids(pod)
            reason = foreign_reason(pod, namespace, rr, workload, ancestors)
        except Exception as e:
            _skip_gated_pod(pod, e, skipped)
            continue
        if reason is None:
            members.append(pod)
            continue
        uid = str(meta(pod).get("uid") or "")
        if L.GATE_PLACEMENT in _gates(pod) and uid not in ctx.component(UngaterState).refused:
            ctx.component(UngaterState).refused.add(uid)
            ctx.metrics.errors.labels("foreign-pod").inc()
            log.warning("pod %s/%s stays gated: %s", namespace, meta(pod).get("name"), reason)
            ctx.workers.background.spawn(
                asyncio.to_thread(
                    post_event,
                    ctx.api,
                    {"apiVersion": "v1", "kind": "Pod", **pod},
                    "PlacementDenied",
                    f"not ungated: {reason}",
                    event_type="Warning",
                    now=ctx.clocks.wall(),
                    action="Ungate",
                ),
                name="refused-pod-event",
            )
    return members


async def _lift(ctx: Context, pod: Mapping[str, Any]) -> None:
    m = meta(pod)
    patch = {"spec": {"schedulingGates": [{"$patch": "delete", "name": L.GATE_PLACEMENT}]}}
    try:
        await asyncio.to_thread(
            ctx.api.patch_pod, str(m.get("name")), str(m.get("namespace")), patch
        )
    except asyncio.CancelledError:  # this replica stops acting: no claim may outlive it
        _claims(ctx).pop(str(m.get("uid")), None)
        raise
    except Exception as e:
        _claims(ctx).pop(str(m.get("uid")), None)
        ctx.metrics.errors.labels("ungate").inc()
        log.warning("could not lift the gate of %s/%s: %s", m.get("namespace"), m.get("name"), e)


def _gates(pod: Mapping[str, Any]) -> list[str]:
    spec = child(pod, "spec")
    return [str(g.get("name")) for g in spec.get("schedulingGates") or [] if isinstance(g, Mapping)]


async def _pin(ctx: Context, pod: Mapping[str, Any], slot: ReservedSlot) -> None:
    m = meta(pod)
    hostname = pinned_hostname(ctx.store.get("Node", slot.node), slot.node)
    uid = str(m.get("uid") or "")
    _claims(ctx)[uid] = slot.key
    # before the patch goes out: a pass's patches run concurrently, so after one returned
    # the others may all have landed; here this pod, at least, is still gated
    ctx.faults.hit("kill-while-ungating")
    try:
        await asyncio.to_thread(
            ctx.api.patch_pod,
            str(m.get("name")),
            str(m.get("namespace")),
            pin_patch(slot, hostname, node_name_terms(pod, slot.node)),
        )
    except asyncio.CancelledError:  # this replica stops acting: no claim may outlive it
        _claims(ctx).pop(uid, None)
        raise
    except Exception as e:  # the pod stays gated; the next pass tries again
        _claims(ctx).pop(uid, None)
        ctx.metrics.errors.labels("ungate").inc()
        log.warning(
            "could not pin pod %s/%s to %s: %s", m.get("namespace"), m.get("name"), slot.node, e
        )
        return
    created = parse_time(m.get("creationTimestamp"))
    if created is not None:
        ctx.metrics.ungate_seconds.observe(max(0.0, (ctx.clocks.wall() - created).total_seconds()))
    log.info("pod %s/%s → %s (slot %s)", m.get("namespace"), m.get("name"), slot.node, slot.key)
