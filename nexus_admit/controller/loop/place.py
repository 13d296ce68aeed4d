"""One Workload of a pass (`place_one`): translate it, answer from what the cluster
already holds for it, else `decide` (placement/decide.py, the replay's decision too) and
apply the decision with writes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from nexus_admit.controller.context import Context
from nexus_admit.controller.elastic import Carry, carry_over
from nexus_admit.controller.events import post_event
from nexus_admit.controller.inflight import (
    held_by,
    overlaps_other,
    withdraw_reservation,
    withdrawn_copy,
)
from nexus_admit.controller.loop.record import (
    PassCapacity,
    PassRecord,
    TimedPolicy,
    drain_reservation_keys,
    ledger_holds,
)
from nexus_admit.controller.outcome import (
    CheckState,
    Outcome,
    clip,
    passthrough,
    placed,
    rejected_input,
    unplaced,
)
from nexus_admit.controller.preemption.apply import (
    apply_drain,
    apply_move_off,
    apply_over_drains,
    apply_preempt,
    drain_tier,
    live_drain,
    preemption_done,
    yielding_drains,
)
from nexus_admit.controller.preemption.victims import (
    is_drain,
    preempted_victims,
    progress,
    running_gangs,
)
from nexus_admit.controller.writes import (
    Answered,
    answer,
    assume,
    commit,
    create_reservation,
    keep_pending,
    placement_of,
    settle,
)
from nexus_admit.kube import labels as L
from nexus_admit.kube.errors import TranslationError, object_key
from nexus_admit.kube.kueue import (
    entry_retry_count,
    provisioned_by,
    provisioning_check_names,
    sibling_node_selectors,
    tas_pod_sets,
    tier_claims,
    unready_provisioning_check,
)
from nexus_admit.kube.serving import with_siblings
from nexus_admit.kube.slices import carried_domain, with_carried
from nexus_admit.kube.views import ReservationView, WorkloadView
from nexus_admit.model import Gang, Placement, PlacementConfig, PodSet
from nexus_admit.placement.decide import (
    Decision,
    DecisionRequest,
    Drain,
    KeepDraining,
    MoveOffDrain,
    Place,
    PlaceOverDrains,
    Preempt,
    Reject,
    Retry,
    decide,
)
from nexus_admit.placement.preemption import RunningGang

__all__ = [
    "DRAIN_RECHECK_SECONDS",
    "DrainRechecks",
    "already_answered",
    "hold_for_provisioning",
    "needs_decision",
    "place_one",
    "within_siblings",
]

DRAIN_RECHECK_SECONDS = 10.0  # how often a draining gang is solved as if it did not drain


async def place_one(rec: PassRecord, view: WorkloadView, check: str) -> None:
    """Decide and write the answer for one Workload that waits on our check `check`, read
    through the store's view of it (`kube/views.py`); the object (`raw`) only where it is
    translated."""
    ctx = rec.ctx
    if not needs_decision(ctx, view):
        return
    config = ctx.checks[check].config
    assert config is not None  # only active checks reach here
    gang = await _translate(rec, view, check, config)
    if gang is None:
        return
    gang = within_siblings(gang, sibling_node_selectors(view.raw, ctx.checks))
    tas = tas_pod_sets(view.raw, rec.kueue)
    if tas:  # Kueue TAS chose these pod sets' hosts already (the snapshot counts them)
        ours = tuple(ps for ps in gang.pod_sets if ps.name not in tas)
        if not ours:
            await answer(ctx, view, check, passthrough(tas))
            return
        gang = replace(gang, pod_sets=ours)  # a mixed Workload: we place and pin the rest
    rr_key = view.reservation_key
    existing = ctx.store.reservation(rr_key)
    if existing is not None:
        if rec.writes is not None:
            await rec.writes.flush(ctx.metrics)  # an earlier create may find GPUs it holds
        if withdrawn_copy(ctx, existing.raw):
            return  # deleted by this run, the watch has not shown it: placed again then
        if overlaps_other(ctx, existing.raw, rec.now):
            # shares a GPU with another reservation (we died between a withdrawal and its
            # delete): never answered from, placed again
            if rr_key not in ctx.ledger.assumed:
                await withdraw_reservation(ctx, rr_key, held_by(existing.raw))
            return
        # a reservation of this attempt exists (we crashed, the check write failed, or it
        # drains or preempts): answer from it, never solve twice
        await _answer_from_reservation(rec, view, check, gang, existing, config)
        return
    carry = carry_over(ctx, view.raw, gang)
    if carry is not None and carry.added is not None:
        await _place_added(rec, view, check, gang, carry, config)
        return
    decided = await _decide(rec, view, gang, config)
    while rec.writes is not None and await _earlier_creates_back(rec, decided[0]):
        # an earlier create found a reservation of its attempt on other slots than solved:
        # this decision may have used those; decide again with them held
        decided = await _decide(rec, view, gang, config)
    await _apply(rec, view, check, decided, config)


async def _earlier_creates_back(rec: PassRecord, decision: Decision) -> bool:
    """Before a decision is applied: a placement needs room in the pipeline; any other
    decision (its writes are awaited in place, and may answer Ready at once) waits for
    every create in flight. True: decide again."""
    assert rec.writes is not None
    if isinstance(decision, Place):
        return await rec.writes.room(rec.ctx.metrics)
    return await rec.writes.flush(rec.ctx.metrics)


async def _translate(
    rec: PassRecord, workload: WorkloadView, check: str, config: PlacementConfig
) -> Gang | None:
    """The Workload as a gang; malformed input is Rejected with its field (the user's to
    fix). A tier a tenant claims on the Workload is ignored, with an Event."""
    ctx = rec.ctx
    try:
        gang = await asyncio.to_thread(rec.dump.gang, workload.raw, config, rec.snapshot,
                                       rec.kueue, now=rec.now)
    except TranslationError as e:
        await answer(ctx, workload, check, rejected_input(e))
        return None
    gang = with_siblings(gang, _assumed_siblings(rec, gang, workload.key))
    gang = _with_assumed_domains(rec, gang)
    claims = tier_claims(workload.raw)
    if claims:  # said once per quota reservation
        await asyncio.to_thread(
            post_event, ctx.api, workload.raw, "TierClaimIgnored",
            f"ignored {', '.join(claims)}: the tier comes only from the ClusterQueue label "
            f"{L.LABEL_TIER}; this Workload is placed as tier {gang.tier}",
            event_type="Warning", now=rec.now,
        )
    return gang


def _assumed_siblings(rec: PassRecord, gang: Gang, workload_key: str) -> dict[str, int]:
    """Where this pass (and earlier ones the watch has not caught up with) placed the
    gang's service: the ledger's reservations that the dump does not hold yet, so a
    Deployment's replicas placed one after the other in one pass spread too."""
    if gang.service is None:
        return {}
    in_dump = {object_key(rr) for rr in rec.dump.kind(L.KIND_RESOURCE_RESERVATION)}
    out: dict[str, int] = {}
    ledger = rec.ctx.ledger
    for a in (*ledger.assumed.values(), *ledger.unsure.values()):
        if a.gang.service != gang.service or a.workload == workload_key:
            continue
        if a.reservation in in_dump:
            continue  # counted from the dump already
        for slot in a.slots:
            out[slot.node] = out.get(slot.node, 0) + 1
    return out


def _with_assumed_domains(rec: PassRecord, gang: Gang) -> Gang:
    """A ComputeDomain gang also keeps out of the cliques this pass (and earlier ones the
    watch has not caught up with) gave other ComputeDomains: the ledger's reservations that
    the dump does not hold yet (the dump's are closed in the translation)."""
    if gang.compute_domain is None:
        return gang
    in_dump = {object_key(rr) for rr in rec.dump.kind(L.KIND_RESOURCE_RESERVATION)}
    ledger, nodes = rec.ctx.ledger, rec.snapshot.nodes
    closed = set(gang.closed_cliques)
    for a in (*ledger.assumed.values(), *ledger.unsure.values()):
        if a.reservation in in_dump or a.gang.compute_domain in (None, gang.compute_domain):
            continue
        for slot in a.slots:
            node = nodes.get(slot.node)
            if node is not None and node.clique is not None:
                closed.add(node.clique)
    return replace(gang, closed_cliques=frozenset(closed))


@dataclass(slots=True)
class _Running:
    """The running gangs preemption may consider, read once per decision and only when
    `decide` asks (from the pass's dump: safe in the solver's thread)."""

    rec: PassRecord
    config: PlacementConfig
    gangs: dict[str, RunningGang] = field(default_factory=dict)
    reservations: dict[str, str] = field(default_factory=dict)
    read: bool = False

    def __call__(self) -> list[RunningGang]:
        if not self.read:
            gangs, self.reservations = running_gangs(
                list(self.rec.ctx.checks), self.rec.dump, self.rec.snapshot, self.rec.kueue,
                self.config, self.rec.now)
            self.gangs = {g.name: g for g in gangs}
            self.read = True
        return list(self.gangs.values())


async def _decide(
    rec: PassRecord, workload: WorkloadView, gang: Gang, config: PlacementConfig,
    own_drain: ReservationView | None = None,
) -> tuple[Decision, _Running, dict[str, ReservationView]]:
    """`decide` in the solver's thread, on the pass's capacity; the running gangs and the
    drains it was given come back with the decision, for applying it."""
    ctx = rec.ctx
    drains: dict[str, ReservationView] = {}
    if config.preemption.enabled:
        drains = yielding_drains(ctx, workload, rec.now,
                                 lambda w: still_waits(ctx, w))
    live = []
    for rr in drains.values():
        tier = drain_tier(ctx, rec.kueue, rr, config)
        if tier is not None:
            live.append(live_drain(rr, tier))
    own = None if own_drain is None else live_drain(own_drain, gang.tier)
    reservations = drain_reservation_keys([*drains.values(),
                                           *([own_drain] if own_drain is not None else [])])
    policy = TimedPolicy(ctx.engine)
    capacity = PassCapacity(rec.snapshot, policy, rec.dump, rec.now, rec.unreserved,
                            reservations, ledger_holds(ctx))
    running = _Running(rec, config)
    request = DecisionRequest(gang, config, waiting=rec.demands, running=running,
                              drains=tuple(live), own_drain=own)
    loop = asyncio.get_running_loop()
    decision = await loop.run_in_executor(ctx.workers.solver, decide, request, capacity)
    for solve in policy.solves:
        labels = (solve.outcome, solve.pods, solve.facts)
        ctx.metrics.solve_seconds.labels(*labels).observe(solve.seconds)
        ctx.metrics.solve_cpu_seconds.labels(*labels).observe(solve.cpu_seconds)
    return decision, running, drains


async def _apply(
    rec: PassRecord, workload: WorkloadView, check: str,
    decided: tuple[Decision, _Running, dict[str, ReservationView]], config: PlacementConfig,
) -> None:
    """Write what the decision means."""
    ctx, placer = rec.ctx, rec.placer
    decision, running, drains = decided
    levels = config.resolve_levels(rec.snapshot.kueue_topologies)
    name = workload.reservation_name
    if isinstance(decision, Place):
        placer.hold(decision.gang, decision.placement.slots)
        ctx.faults.hit("kill-after-solve")
        await _write_placed(rec, workload, check, decision.gang, decision.placement, config)
    elif isinstance(decision, PlaceOverDrains):
        held = await apply_over_drains(ctx, placer, workload, check, decision, drains, config,
                                       rec.now)
        if held is not None:
            await answer(ctx, workload, check,
                         placed(held, decision.gang, name, rec.snapshot, levels,
                                hardware_class=config.hardware_class))
    elif isinstance(decision, Preempt):
        await apply_preempt(ctx, placer, workload, check, decision, running.gangs,
                            running.reservations, config, rec.now)
    elif isinstance(decision, Drain):
        await apply_drain(ctx, placer, workload, check, decision, running.reservations, config,
                          rec.now)
    elif isinstance(decision, (MoveOffDrain, KeepDraining)):
        raise AssertionError("a Workload without a reservation has no drain of its own")
    else:  # Retry, Reject
        retries = entry_retry_count(workload.check(check))
        outcome = unplaced(decision.placement, retries, ctx.options.retry_seconds)
        booked = provisioned_by(
            workload.raw, provisioning_check_names(rec.dump.kind("AdmissionCheck")))
        if outcome.state is CheckState.RETRY and booked is not None:
            # the autoscaler booked nodes that are still joining (cluster-autoscaler says
            # Provisioned once the scale-up is under way): Retry would evict and delete
            # the ProvisioningRequest with its booking. Kueue's check turns Retry itself
            # if the booking expires before the pods come.
            await keep_pending(ctx, workload, check, clip(
                f"waiting for the nodes the provisioning check {booked} provisioned: "
                f"{decision.placement.reason}"), "WaitingForProvisionedNodes")
        elif outcome.state is CheckState.PENDING:  # waits for nodes: every pass looks again
            await keep_pending(ctx, workload, check, outcome.message, outcome.event_reason)
        else:
            await answer(ctx, workload, check, outcome)


async def _place_added(
    rec: PassRecord, workload: WorkloadView, check: str, gang: Gang, carry: Carry,
    config: PlacementConfig,
) -> None:
    """A Workload slice that replaces one we placed (an elastic Job scaled up): its running
    pods keep their slots, carried over; only the added pods are placed, in the carried
    slots' smallest shared domain first, without preemption. No room: Pending, never Retry
    (its eviction would stop the Job's running pods)."""
    assert carry.added is not None
    ctx = rec.ctx
    quiet = config.model_copy(update={
        "preemption": config.preemption.model_copy(update={"enabled": False})})
    levels = config.resolve_levels(rec.snapshot.kueue_topologies)
    domain = carried_domain(carry.carried, rec.snapshot.nodes, levels)
    tries = [within_siblings(carry.added, {ps.name: domain for ps in carry.added.pod_sets}),
             carry.added] if domain else [carry.added]
    for added in tries:
        decided = await _decide(rec, workload, added, quiet)
        while rec.writes is not None and await _earlier_creates_back(rec, decided[0]):
            decided = await _decide(rec, workload, added, quiet)
        decision = decided[0]
        if isinstance(decision, Place):
            rec.placer.hold(decision.gang, decision.placement.slots)
            await _write_placed(rec, workload, check, decision.gang, decision.placement,
                                config, carry=(carry, gang))
            return
    why = decision.placement.reason if isinstance(decision, (Retry, Reject)) else "no room"
    if isinstance(decision, Reject):
        retries = entry_retry_count(workload.check(check))
        await answer(ctx, workload, check,
                     unplaced(decision.placement, retries, ctx.options.retry_seconds))
        return
    await keep_pending(ctx, workload, check, clip(
        f"waiting for room for the {sum(ps.count for ps in carry.added.pod_sets)} pod(s) "
        f"the scale-up adds; the {carry.kept} carried slot(s) stay held: {why}"),
        "PlacementWaiting")


async def _write_placed(
    rec: PassRecord, workload: WorkloadView, check: str, gang: Gang, placement: Placement,
    config: PlacementConfig, carry: tuple[Carry, Gang] | None = None,
) -> None:
    """Assume, reserve, answer: the writes overlap the next Workload's decision. `carry`:
    a Workload slice's carry-over and its whole gang: the reservation holds the carried
    slots too, and the check answers for every pod set."""
    ctx = rec.ctx
    body = assume(ctx, rec.placer, workload, gang, placement, config, rec.now)
    levels = config.resolve_levels(rec.snapshot.kueue_topologies)
    if carry is not None:
        kept, whole = carry
        body = with_carried(body, kept.old, kept.carried, [ps.name for ps in whole.pod_sets],
                            kept.pod_label)
        merged = placement_of(body, whole)
        snapshot, name = rec.snapshot, workload.reservation_name

        def ready_whole(_: Placement) -> Outcome:
            return placed(merged, whole, name, snapshot, levels,
                          hardware_class=config.hardware_class)

        if rec.writes is None:
            reserved = await create_reservation(ctx, snapshot, workload, gang, placement, body)
            settle(rec.placer, reserved)
            if reserved.placement is not None:
                await answer(ctx, workload, check, ready_whole(merged))
            return
        rec.writes.start(workload, check, gang, tuple(placement.slots), ready_whole,
                         create_reservation(ctx, snapshot, workload, gang, placement, body))
        return
    if rec.writes is None:
        settle(rec.placer, await commit(ctx, rec.snapshot, workload, check, gang, placement,
                                        body, levels, config.hardware_class))
        return
    snapshot, name = rec.snapshot, workload.reservation_name

    def ready(held: Placement) -> Outcome:
        return placed(held, gang, name, snapshot, levels, hardware_class=config.hardware_class)

    rec.writes.start(workload, check, gang, tuple(placement.slots), ready,
                     create_reservation(ctx, snapshot, workload, gang, placement, body))


async def _answer_from_reservation(
    rec: PassRecord, workload: WorkloadView, check: str, gang: Gang,
    existing: ReservationView, config: PlacementConfig,
) -> None:
    """The snapshot counts `existing` already. A drain waits only while its gang fits
    nowhere else; a preemption waits for its victims to leave; then Ready from it."""
    ctx = rec.ctx
    name = workload.reservation_name
    levels = config.resolve_levels(rec.snapshot.kueue_topologies)
    victims = preempted_victims(existing)
    if (
        victims
        and is_drain(existing)
        and config.preemption.enabled
        and _drain_check_due(ctx, existing)
        and not (await progress(ctx, existing, victims, config, rec.now)).done
    ):
        decided = await _decide(rec, workload, gang, config, own_drain=existing)
        decision = decided[0]
        if isinstance(decision, MoveOffDrain):
            held = await apply_move_off(ctx, rec.placer, workload, check, decision, existing,
                                        config, rec.now)
            if held is not None:
                await answer(ctx, workload, check,
                             placed(held, decision.gang, name, rec.snapshot, levels,
                                hardware_class=config.hardware_class))
            return
    if victims and not await preemption_done(ctx, workload, check, existing, victims, config,
                                             rec.now):
        return
    await answer(ctx, workload, check,
                 placed(placement_of(existing.raw, gang), gang, name, rec.snapshot, levels,
                        hardware_class=config.hardware_class))


@dataclass
class DrainRechecks:
    """Draining reservation "namespace/name" → monotonic time its gang was last solved
    without it (a drain moved off once its gang fits)."""

    at: dict[str, float] = field(default_factory=dict)

    def reset(self) -> None:
        self.at = {}


def _drain_check_due(ctx: Context, rr: ReservationView) -> bool:
    """At most one solve without a drain per DRAIN_RECHECK_SECONDS: each rebuilds the
    fleet's snapshot, and passes come on every event; a drain waits minutes to hours."""
    key, tick, checked = rr.key, ctx.clocks.monotonic(), ctx.component(DrainRechecks).at
    if tick - checked.get(key, float("-inf")) < DRAIN_RECHECK_SECONDS:
        return False
    checked[key] = tick
    return True


async def hold_for_provisioning(
    ctx: Context, workloads: Sequence[WorkloadView], provisioning: set[str]
) -> set[str]:
    """The Workloads (keys) that wait for one of Kueue's `provisioning` checks to be Ready
    before we place them; each keeps our check Pending with a message that says so.

    Why wait: until the ProvisioningRequest is Provisioned its nodes are not in the fleet,
    so a placement now would go on the existing nodes or answer Retry, and Retry ends in an
    eviction that deletes the ProvisioningRequest and its booked capacity (Kueue v0.19.2,
    CleanupProvisioningRequestsOnEviction, on by default). Nothing is held meanwhile, so no
    reservation lapses however long the provisioner takes. A Workload with a reservation
    of this attempt is not held: it is answered from it, never placed twice."""
    held: set[str] = set()
    for wl in workloads:
        check = our_pending_check(wl, ctx)
        unready = unready_provisioning_check(wl.raw, provisioning)
        if check is None or unready is None or not needs_decision(ctx, wl):
            continue
        if ctx.store.get(L.KIND_RESOURCE_RESERVATION, wl.reservation_key) is not None:
            continue
        held.add(wl.key)
        name, state, said = unready
        why = f"it says: {said}" if said else "the provisioner has not answered yet"
        await keep_pending(
            ctx, wl, check,
            clip(f"waiting for the provisioning check {name} to be Ready ({state}; {why})"),
            "WaitingForProvisioning",
        )
    return held


def within_siblings(gang: Gang, selectors: Mapping[str, Mapping[str, str]]) -> Gang:
    """The gang on the nodes the Workload's other Ready checks send its pods to: their
    podSetUpdates' nodeSelector (the provisioned nodes, for Kueue's provisioning check)
    joins each pod set's own, since Kueue puts both on the pods."""
    if not selectors:
        return gang

    def narrowed(ps: PodSet) -> PodSet:
        theirs = selectors.get(ps.name)
        if not theirs:
            return ps
        merged = dict(ps.node_selector)
        for key, value in theirs.items():
            if merged.get(key, value) != value:
                merged["\0conflict"] = ""  # no node can match both
            merged[key] = value
        return replace(ps, node_selector=merged)

    return replace(gang, pod_sets=tuple(narrowed(ps) for ps in gang.pod_sets))


def our_pending_check(workload: WorkloadView, ctx: Context) -> str | None:
    """The name of our check this Workload waits on (Pending), if any
    (`kueue.pending_checks`' first)."""
    checks = ctx.checks
    return next((str(e["name"]) for e in workload.checks
                 if e.get("name") in checks and e.get("state") == "Pending"), None)


def still_waits(ctx: Context, workload: WorkloadView) -> bool:
    """It waits on our check, and no answer of ours is in flight for it."""
    return our_pending_check(workload, ctx) is not None and not already_answered(ctx, workload)


def needs_decision(ctx: Context, workload: WorkloadView) -> bool:
    """Is there anything to decide for this pending Workload? Not when its answer is
    written (or going out), nor when its reservation was created in this run and the watch
    has not brought it yet (its check is written again once it does). The pass asks
    before it builds the snapshot, `place_one` before anything else."""
    if already_answered(ctx, workload):
        return False
    rr_key = workload.reservation_key
    return not (
        rr_key in ctx.ledger.assumed
        and ctx.store.get(L.KIND_RESOURCE_RESERVATION, rr_key) is None
    )


def already_answered(ctx: Context, workload: WorkloadView) -> bool:
    uid = workload.uid
    return bool(uid) and ctx.component(Answered).attempts.get(uid) == workload.attempt
