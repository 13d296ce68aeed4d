"""Placement-level preemption and backfill: which running gangs to evict so that a waiting
gang fits, all inside one fabric domain, and which hardware a lower tier may only borrow.

Kueue preempts by quota: it frees *some* GPUs of a ClusterQueue. A gang needs them in the
right *place* (one rack, one NVLink domain), so the victim choice here is a placement
question: the cheapest set of whole evictable gangs whose removal lets the preemptor be
placed inside one domain of the level it needs. The feasibility of every candidate set is
decided by the placement policy itself (the one placement code path), on a copy of the
domain with the victims' capacity given back; sets are tried cheapest first, so the first
that fits is the cheapest (ties broken by the placement's objective).

Pure: no Kubernetes client. The controller (eviction through Kueue) and the replay
simulator call the same `plan_preemption`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from nexus_admit.model import (
    GPU_WHOLE,
    HOSTNAME_LABEL,
    ClusterSnapshot,
    Domain,
    Gang,
    Placement,
    PlacementConfig,
    Slot,
    SolveStatus,
    domain_at,
    release_slots,
    with_clique_level,
)
from nexus_admit.placement.base import PlacementPolicy
from nexus_admit.placement.problem import prepare

__all__ = [
    "PreemptionPlan",
    "RunningGang",
    "Victim",
    "answer_when_kept_off",
    "borrowed_nodes",
    "evictable",
    "is_borrowed",
    "owners_waiting",
    "plan_drain",
    "plan_preemption",
    "restrict_borrowing",
    "victim_cost",
]

# Bounds on the search; small instances never reach them (the property tests check the
# result against brute force there). On a big fleet the cheapest sets come first anyway.
MAX_SOLVES = 48  # placement solves over all domains
MAX_SUBSETS = 20_000  # candidate sets looked at (most fail the cheap capacity bound)


@dataclass(frozen=True, slots=True)
class RunningGang:
    """A placed gang as preemption sees it: its slots and what evicting it would cost."""

    gang: Gang
    slots: tuple[Slot, ...]
    ran_seconds: float = 0.0
    priority: int = 0
    # False for gangs the caller must never touch (outside the nexus check, finishing, ...)
    evictable: bool = True

    @property
    def name(self) -> str:
        return self.gang.name

    @property
    def gpus(self) -> float:
        """GPUs held, in whole-GPU units (shares count as their fraction)."""
        by_set = {p.name: p for p in self.gang.pod_sets}
        return sum(by_set[s.pod_set].gpu_milli_per_pod for s in self.slots) / GPU_WHOLE


@dataclass(frozen=True, slots=True)
class Victim:
    name: str
    tier: str
    gpus: float
    lost_gpu_hours: float
    cost: int


@dataclass(slots=True)
class PreemptionPlan:
    """Evict `victims` (whole gangs), then `placement` is feasible: it was solved on the
    snapshot with the victims' capacity given back, inside one domain of `level`."""

    placement: Placement
    victims: tuple[Victim, ...]
    level: str | None  # None: the whole cluster was needed
    domain: Domain | None
    cost: int
    solves: int
    nodes: frozenset[str] = frozenset()  # every node of the domain

    @property
    def victim_names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.victims)

    @property
    def lost_gpu_hours(self) -> float:
        return sum(v.lost_gpu_hours for v in self.victims)

    def domain_name(self) -> str:
        if self.domain is None:
            return "the cluster"
        return f"{self.level}={'/'.join(self.domain)}"

    def describe(self) -> str:
        names = ", ".join(f"{v.name} ({v.tier}, {v.gpus:g} GPUs, ran {v.lost_gpu_hours:.1f} "
                          f"GPU-h)" for v in self.victims)
        return f"evict {len(self.victims)} in {self.domain_name()}: {names}"


def is_borrowed(snapshot: ClusterSnapshot, gang: Gang, slots: Iterable[Slot],
                config: PlacementConfig) -> bool:
    """Whether any slot sits on hardware a higher tier owns (see `Preemption`)."""
    classes = config.borrowed_classes(gang.tier)
    if not classes:
        return False
    for slot in slots:
        node = snapshot.nodes.get(slot.node)
        if node is not None and config.hardware_class(node.gpu_product) in classes:
            return True
    return False


def borrowed_nodes(snapshot: ClusterSnapshot, tier: str, config: PlacementConfig,
                   owners: Iterable[str]) -> frozenset[str]:
    """Nodes of the classes `tier` would borrow from one of `owners`."""
    classes = {cls for cls in config.borrowed_classes(tier)
               if config.class_owner(cls) in set(owners)}
    if not classes:
        return frozenset()
    return frozenset(n.name for n in snapshot
                     if n.gpu_count and config.hardware_class(n.gpu_product) in classes)


def owners_waiting(snapshot: ClusterSnapshot, config: PlacementConfig,
                   waiting: Iterable[tuple[str, int]]) -> frozenset[str]:
    """Tiers with a waiting gang (tier, GPU share in milli-GPUs) that the free GPUs of the
    hardware they own could hold: backfill keeps lower tiers off that hardware. A tier whose
    waiting gangs are all too big for what is free there leaves it to be borrowed
    (preemption can get it back when the gang could fit)."""
    free: dict[str, int] = {}
    for node in snapshot:
        cls = config.hardware_class(node.gpu_product) if node.gpu_count else None
        if cls is not None:
            free[cls] = free.get(cls, 0) + node.free_gpu_milli
    out = set()
    for tier, gpu_milli in waiting:
        owned = sum(m for cls, m in free.items() if config.class_owner(cls) == tier)
        if 0 < gpu_milli <= owned:
            out.add(tier)
    return frozenset(out)


def restrict_borrowing(snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig,
                       waiting_tiers: Iterable[str]) -> Gang:
    """Backfill: `gang` keeps off the hardware owned by a tier that has Workloads waiting
    (they could use it), and may borrow the rest. Unchanged while preemption or backfill
    is off, or when nothing it could borrow is wanted."""
    pre = config.preemption
    if not (pre.enabled and pre.backfill):
        return gang
    waiting = {t for t in waiting_tiers if config.tier_rank(t) < config.tier_rank(gang.tier)}
    banned = borrowed_nodes(snapshot, gang.tier, config, waiting)
    if not banned:
        return gang
    everything = frozenset(snapshot.nodes)
    pod_sets = tuple(
        replace(ps, allowed_nodes=(ps.allowed_nodes if ps.allowed_nodes is not None
                                   else everything) - banned)
        for ps in gang.pod_sets
    )
    return replace(gang, pod_sets=pod_sets)


def answer_when_kept_off(snapshot: ClusterSnapshot, original: Gang, placement: Placement,
                          config: PlacementConfig, why: str) -> Placement:
    """The answer for a gang kept off some nodes for a while (backfill, a drained domain):
    when it does not fit, its reason starts with `why` (the user reads it in the check
    message and the Retry Event). One that then cannot ever fit, or fits no node now, is only
    kept off: Retry, unless the gang as the user asked for it could never fit either
    (Rejected) or fits no node now either (it waits)."""
    if placement.feasible:
        return placement
    if placement.status in (SolveStatus.IMPOSSIBLE, SolveStatus.UNAVAILABLE):
        try:
            asked = prepare(snapshot, original, config)
        except ValueError:
            return placement
        if asked.impossible:
            return placement
        placement.status = (SolveStatus.UNAVAILABLE if asked.unavailable
                            else SolveStatus.INFEASIBLE)
    placement.reason = f"{why}; {placement.reason}"
    return placement


def evictable(preemptor: Gang, victim: RunningGang, snapshot: ClusterSnapshot,
              config: PlacementConfig) -> str | None:
    """Why `victim` may not be evicted for `preemptor`, or None when it may."""
    pre = config.preemption
    if not victim.evictable:
        return "not evictable"
    if victim.name == preemptor.name:
        return "the preemptor itself"
    if victim.gang.tier not in config.evictable_tiers(preemptor.tier):
        return f"tier {victim.gang.tier} may not be evicted by {preemptor.tier}"
    if victim.ran_seconds < pre.min_run_seconds:
        return f"ran {victim.ran_seconds:.0f} s < minRunSeconds {pre.min_run_seconds:.0f}"
    if pre.victims == "borrowed" and not is_borrowed(snapshot, victim.gang, victim.slots,
                                                     config):
        return "runs on its own tier's hardware (victims: borrowed)"
    return None


def victim_cost(victim: RunningGang, config: PlacementConfig) -> Victim:
    w = config.preemption.weights
    lost = victim.gpus * victim.ran_seconds / 3600.0
    lowest = len(config.tiers) - 1
    above_lowest = max(0, lowest - config.tier_rank(victim.gang.tier))
    cost = (w.victim + round(w.lost_gpu_hour * lost) + w.tier * above_lowest
            + w.priority * max(0, victim.priority))
    return Victim(victim.name, victim.gang.tier, victim.gpus, round(lost, 3), cost)


def _preemption_levels(gang: Gang, levels: Sequence[str], config: PlacementConfig) -> list[str]:
    """The levels to look for one domain at, lowest first: the gang's own level (required,
    preferred, localityWait, or the host for one pod), then every level above it."""
    if gang.required_level is not None:
        return [gang.required_level] if gang.required_level in levels else []
    if gang.pod_count == 1:
        start = HOSTNAME_LABEL
    elif gang.preferred_level in levels:
        start = gang.preferred_level  # type: ignore[assignment]
    elif config.locality_wait is not None and config.locality_wait.level in levels:
        start = config.locality_wait.level
    else:
        start = levels[-2] if len(levels) > 1 else levels[-1]
    upward = list(reversed(levels[: list(levels).index(start) + 1]))
    wait = config.locality_wait
    if wait is not None and wait.level in upward and gang.pod_count > 1:
        # the gang would rather wait for one such domain than run split: so would its victims
        return upward[: upward.index(wait.level) + 1]
    return upward


@dataclass(slots=True)
class _Domain:
    level: str | None
    key: Domain | None
    nodes: frozenset[str]
    candidates: list[tuple[Victim, RunningGang]]  # cheapest first


def _domains(snapshot: ClusterSnapshot, levels: Sequence[str], level_order: list[str | None],
             victims: list[tuple[Victim, RunningGang]]) -> list[_Domain]:
    out: list[_Domain] = []
    for level in level_order:
        if level is None:
            continue
        members: dict[Domain, set[str]] = {}
        for node in snapshot:
            key = domain_at(node, levels, level)
            if key is not None:
                members.setdefault(key, set()).add(node.name)
        for key in sorted(members):
            nodes = frozenset(members[key])
            cands = [(v, r) for v, r in victims if any(s.node in nodes for s in r.slots)]
            if cands:
                out.append(_Domain(level, key, nodes, cands))
    return out


def _gang_levels(
    snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig
) -> tuple[str, ...] | None:
    """The levels the gang is placed with (a ComputeDomain's: the NVLink clique heading
    them, as `prepare` has them); None when the config cannot be resolved."""
    try:
        levels = config.resolve_levels(snapshot.kueue_topologies)
    except ValueError:
        return None
    return with_clique_level(levels, gang.compute_domain is not None)


def _open_to(gang: Gang, snapshot: ClusterSnapshot, domains: list[_Domain]) -> list[_Domain]:
    """The domains a ComputeDomain gang may be placed in: not in a clique another
    ComputeDomain holds (a ComputeDomain's domains lie inside one clique)."""
    if not gang.closed_cliques:
        return domains
    return [d for d in domains
            if not any(snapshot.nodes[n].clique in gang.closed_cliques for n in d.nodes)]


def _released(snapshot: ClusterSnapshot, nodes: frozenset[str],
              chosen: Iterable[RunningGang]) -> ClusterSnapshot:
    sub = ClusterSnapshot(
        {name: snapshot.nodes[name].copy() for name in sorted(nodes)},
        dict(snapshot.kueue_topologies),
    )
    for r in chosen:
        release_slots(sub, r.gang, [s for s in r.slots if s.node in nodes])
    return sub


class _Bound:
    """A cheap necessary condition for "the gang fits in this domain once these victims are
    gone", from GPU shares alone: per pod set, the pods each eligible node could hold with
    its free share plus what the victims free there; and the gang's total share. Most
    candidate sets fail it, so only the rest cost a copy of the domain and a solve."""

    def __init__(self, snapshot: ClusterSnapshot, gang: Gang, dom: _Domain) -> None:
        self.gang = gang
        self.free = {n: snapshot.nodes[n].free_gpu_milli for n in dom.nodes}
        self.freed: list[dict[str, int]] = []
        for _, r in dom.candidates:
            per_set = {p.name: p.gpu_milli_per_pod for p in r.gang.pod_sets}
            freed: dict[str, int] = {}
            for s in r.slots:
                if s.node in self.free:
                    freed[s.node] = freed.get(s.node, 0) + per_set[s.pod_set]
            self.freed.append(freed)
        self.eligible = [
            (ps, [n for n in sorted(dom.nodes) if ps.static_fit(snapshot.nodes[n]) is None])
            for ps in gang.pod_sets if ps.gpus
        ]

    def holds(self, idx: Iterable[int]) -> bool:
        share = dict(self.free)
        for k in idx:
            for node, milli in self.freed[k].items():
                share[node] += milli
        if sum(share.values()) < self.gang.gpu_milli:
            return False
        for ps, nodes in self.eligible:
            if ps.fractional:
                room = sum(share[n] // ps.gpu_milli for n in nodes)
            else:
                room = sum(share[n] // (ps.gpus * GPU_WHOLE) for n in nodes)
            if room < ps.count:
                return False
        return True


def _subsets_by_cost(costs: Sequence[int], max_size: int) -> Iterable[tuple[int, tuple[int, ...]]]:
    """Every non-empty index set of at most `max_size` items, in nondecreasing total cost
    (costs sorted ascending): from a set whose last index is i come the set plus i+1 and the
    set with i replaced by i+1, which reaches every set exactly once."""
    if not costs or max_size < 1:
        return
    heap: list[tuple[int, tuple[int, ...]]] = [(costs[0], (0,))]
    while heap:
        total, idx = heapq.heappop(heap)
        yield total, idx
        last = idx[-1]
        if last + 1 < len(costs):
            if len(idx) < max_size:
                heapq.heappush(heap, (total + costs[last + 1], (*idx, last + 1)))
            heapq.heappush(heap, (total - costs[last] + costs[last + 1], (*idx[:-1], last + 1)))


def plan_preemption(
    policy: PlacementPolicy,
    snapshot: ClusterSnapshot,
    gang: Gang,
    running: Sequence[RunningGang],
    config: PlacementConfig,
) -> PreemptionPlan | None:
    """The cheapest set of whole evictable gangs, all with a pod in one domain, whose
    eviction lets `policy` place `gang` inside that domain; None when preemption is off or
    no allowed set (at most `maxVictimsPerGang`) makes room.

    `snapshot` is net of everything running (the victims included); it is not mutated.
    The domain is one of the level the gang needs (its required level; else its preferred
    level, localityWait's level or the level above the host; the host for one pod), or of a
    higher level when no such domain can be freed."""
    pre = config.preemption
    if not pre.enabled or not config.evictable_tiers(gang.tier):
        return None
    levels = _gang_levels(snapshot, gang, config)
    if levels is None:
        return None
    allowed = [(victim_cost(r, config), r) for r in running
               if evictable(gang, r, snapshot, config) is None]
    if not allowed:
        return None
    allowed.sort(key=lambda vr: (vr[0].cost, vr[0].name))
    # the solve inside a domain must not hold the gang for locality: the domain is the hold
    solve_config = config.model_copy(update={"locality_wait": None})
    order: list[str | None] = list(_preemption_levels(gang, levels, config))
    domains = _open_to(gang, snapshot, _domains(snapshot, levels, order, allowed))
    held_for_locality = config.locality_wait is not None and gang.pod_count > 1
    if gang.required_level is None and not held_for_locality:
        # last resort: anywhere in the cluster
        domains.append(_Domain(None, None, frozenset(snapshot.nodes), allowed))
        order.append(None)

    best: PreemptionPlan | None = None
    budget = _Budget()
    for level in order:
        best = _cheapest(policy, snapshot, gang, [d for d in domains if d.level == level],
                         solve_config, budget)
        if best is not None:
            break
    if best is not None:
        best.solves = budget.solves
        best.placement.explanation.append(best.describe())
    return best


@dataclass(slots=True)
class _Budget:
    solves: int = 0
    looked: int = 0

    def spent(self) -> bool:
        return self.solves >= MAX_SOLVES or self.looked >= MAX_SUBSETS


def _cheapest(policy: PlacementPolicy, snapshot: ClusterSnapshot, gang: Gang,
              domains: list[_Domain], config: PlacementConfig,
              budget: _Budget) -> PreemptionPlan | None:
    """The cheapest candidate set over `domains` (all of one level) that lets the gang be
    placed inside its domain; equal costs go to the better placement objective. One heap
    over every domain's candidate sets: the first set that fits is the cheapest."""
    bounds = [_Bound(snapshot, gang, d) for d in domains]
    # a domain that cannot hold the gang even with every candidate gone is never searched
    live = [i for i, b in enumerate(bounds) if b.holds(range(len(domains[i].candidates)))]
    domains = [domains[i] for i in live]
    bounds = [bounds[i] for i in live]
    streams = [_subsets_by_cost([v.cost for v, _ in d.candidates],
                                config.preemption.max_victims_per_gang) for d in domains]
    heap: list[tuple[int, int, tuple[int, ...]]] = []
    for i, stream in enumerate(streams):
        first = next(iter(stream), None)
        if first is not None:
            heapq.heappush(heap, (first[0], i, first[1]))
    best: PreemptionPlan | None = None
    cap = config.preemption.max_lost_gpu_hours
    while heap and not budget.spent():
        cost, i, idx = heapq.heappop(heap)
        if best is not None and cost > best.cost:
            break
        nxt = next(iter(streams[i]), None)
        if nxt is not None:
            heapq.heappush(heap, (nxt[0], i, nxt[1]))
        budget.looked += 1
        dom = domains[i]
        if cap is not None and sum(dom.candidates[k][0].lost_gpu_hours for k in idx) > cap:
            continue
        if not bounds[i].holds(idx):
            continue
        chosen = [dom.candidates[k] for k in idx]
        sub = _released(snapshot, dom.nodes, [r for _, r in chosen])
        budget.solves += 1
        placement = policy.place(sub, gang, config)
        if not placement.feasible:
            continue
        if best is None or placement.objective < best.placement.objective:
            best = PreemptionPlan(placement, tuple(v for v, _ in chosen), dom.level, dom.key,
                                  cost, 0, dom.nodes)
    return best


def plan_drain(
    policy: PlacementPolicy,
    snapshot: ClusterSnapshot,
    gang: Gang,
    running: Sequence[RunningGang],
    config: PlacementConfig,
) -> PreemptionPlan | None:
    """Drain-to-fit: for a gang that has waited `preemption.drainAfterSeconds` and still does
    not fit, the domain to let drain for it: the one of the level it needs that could hold it
    once the running gangs there are gone, with the fewest GPUs busy now (it frees soonest
    when run times are alike). Nothing is evicted: the caller keeps new placements out of
    the domain until the gang fits. `victims` are the gangs to wait for, those on the nodes
    the placement uses (every tier; `cost` is the GPUs they hold). None when drain is off,
    the gang has not waited long enough, or no domain could ever hold it."""
    pre = config.preemption
    after = pre.drain_after_seconds
    if not pre.enabled or after is None or gang.waited_seconds < after or gang.pod_count < 2:
        return None
    levels = _gang_levels(snapshot, gang, config)
    if levels is None:
        return None
    order: list[str | None] = list(_preemption_levels(gang, levels, config))
    waited_for = [(victim_cost(r, config), r) for r in running if r.name != gang.name]
    solve_config = config.model_copy(update={"locality_wait": None})
    solves = 0
    if gang.required_level is None and not (config.locality_wait is not None):
        order.append(None)  # last resort: the whole cluster
    for level in order:
        ranked = []
        domains = (_open_to(gang, snapshot, _domains(snapshot, levels, [level], waited_for))
                   if level is not None
                   else [_Domain(None, None, frozenset(snapshot.nodes), waited_for)])
        for dom in domains:
            busy = sum(v.gpus for v, _ in dom.candidates)
            ranked.append((busy, dom.key or (), dom))
        ranked.sort(key=lambda t: (t[0], t[1]))
        for busy, _, dom in ranked:
            if solves >= MAX_SOLVES:
                return None
            sub = _released(snapshot, dom.nodes, [r for _, r in dom.candidates])
            solves += 1
            placement = policy.place(sub, gang, solve_config)
            if placement.feasible:
                used = {slot.node for slot in placement.slots}
                blocking = [(v, r) for v, r in dom.candidates
                            if any(slot.node in used for slot in r.slots)]
                busy = sum(v.gpus for v, _ in blocking)
                plan = PreemptionPlan(placement, tuple(v for v, _ in blocking),
                                      dom.level, dom.key, round(busy), solves, dom.nodes)
                placement.explanation.append(
                    f"draining {plan.domain_name()} for this gang: new placements avoid it "
                    f"until {len(plan.victims)} running Workload(s) there finish "
                    f"({busy:g} GPUs busy)"
                )
                return plan
    return None
