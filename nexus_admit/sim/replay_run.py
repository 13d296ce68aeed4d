"""One run of the multi-tenant gang replay (`run_replay`): Kueue's queueing and quota
modelled in memory, every placement decision made by `placement.decide`, the same
decision the controller's pass makes, applied here to the simulated cluster."""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nexus_admit.model import GPU_WHOLE, Gang, Node, PlacementConfig, Slot
from nexus_admit.placement import decide as decisions
from nexus_admit.placement.base import PlacementPolicy
from nexus_admit.placement.decide import (
    DecisionRequest,
    Drain,
    KeepDraining,
    LiveDrain,
    MoveOffDrain,
    NodesKeptFree,
    Place,
    PlaceOverDrains,
    Preempt,
    Reject,
)
from nexus_admit.placement.preemption import RunningGang
from nexus_admit.placement.problem import prepare
from nexus_admit.placement.sequence import OrderedPlacer
from nexus_admit.placement.tracking import TrackedSnapshot
from nexus_admit.sim import replay_model as m
from nexus_admit.sim.openb import DEFAULT_DATA
from nexus_admit.sim.replay_model import (
    AGG_LABEL,
    PRICE,
    PRIORITY,
    TIERS,
    TOR_LABEL,
    WAIT_REASONS,
    Drains,
    Job,
    ReplayResult,
    ReplayScenario,
    _groups,
    _size_group,
    _stats,
    build_cluster,
    generate_jobs,
    make_replay_policy,
    may_preempt,
    preemption_mode,
    quota_room,
    replay_config,
    spread_factor,
)

__all__ = ["ReplayRun", "run_replay"]


def run_replay(
    policy_name: str,
    scn: ReplayScenario | None = None,
    data: Path = DEFAULT_DATA,
    policy_factory: Callable[[str, int, Sequence[Job]], PlacementPolicy] | None = None,
    *,
    drain: bool = False,
    snapshot_out: list[TrackedSnapshot] | None = None,
    config: PlacementConfig | None = None,
) -> ReplayResult:
    """One replay. Metrics cover the arrival window; `drain` keeps running departures
    afterwards (until nothing is queued or running), `snapshot_out` receives the snapshot."""
    run = ReplayRun.start(policy_name, scn or ReplayScenario(), data, policy_factory, config)
    if snapshot_out is not None:
        snapshot_out.append(run.snap)
    run.run(drain=drain)
    return run.result()


@dataclass
class _Tally:
    """What the run integrates over time and counts."""

    acc: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    state: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("alloc", "eff", "cost", "bronze_premium", "stranded"), 0.0))
    waited: dict[str, dict[str, float]] = field(
        default_factory=lambda: defaultdict(lambda: dict.fromkeys(WAIT_REASONS, 0.0)))
    series_t: list[float] = field(default_factory=list)
    series_alloc: list[float] = field(default_factory=list)
    series_islands: list[int] = field(default_factory=list)
    locality: list[tuple[int, int, float]] = field(default_factory=list)
    evictions: int = 0
    completed: int = 0
    rejected: int = 0
    placements: int = 0
    place_seconds: float = 0.0


@dataclass
class ReplayRun:
    """The state of one replay: the cluster, the queue, the running jobs, Kueue's quota."""

    policy_name: str
    scn: ReplayScenario
    nodes: list[Node]
    snap: TrackedSnapshot
    jobs: list[Job]
    config: PlacementConfig
    policy: PlacementPolicy
    placer: OrderedPlacer
    preempt_mode: str | None
    quota_preempt: bool
    quota: dict[str, float]
    started: float
    now: float = 0.0
    usage: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIERS, 0.0))
    events: list[tuple[float, int, str, int]] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    running: dict[int, tuple[Gang, list[Slot], float]] = field(default_factory=dict)
    started_at: dict[int, float] = field(default_factory=dict)  # first start (delays)
    run_start: dict[int, float] = field(default_factory=dict)  # start of the current run
    ends_at: dict[int, float] = field(default_factory=dict)  # departure (stale if evicted)
    wake_at: dict[int, float] = field(default_factory=dict)  # when a locality hold ends
    why: dict[int, str] = field(default_factory=dict)  # why it did not start last cycle
    drains: Drains = field(default_factory=Drains)
    tally: _Tally = field(default_factory=_Tally)

    @classmethod
    def start(cls, policy_name: str, scn: ReplayScenario, data: Path,
              policy_factory: Callable[[str, int, Sequence[Job]], PlacementPolicy] | None,
              config: PlacementConfig | None) -> ReplayRun:
        started = time.perf_counter()
        nodes = build_cluster(scn, data)
        snap = TrackedSnapshot.of(nodes)
        jobs = generate_jobs(scn, snap.total_gpus)
        base_policy, preempt_mode, quota_preempt = preemption_mode(policy_name)
        config = config or replay_config(scn)
        if preempt_mode in ("placement", "drain"):
            pre = m.REPLAY_PREEMPTION
            if preempt_mode == "drain":
                pre = pre.model_copy(update={"drain_after_seconds": m.REPLAY_DRAIN_AFTER})
            config = config.model_copy(update={"preemption": pre})
            preempt_mode = "placement"
        policy = (policy_factory or make_replay_policy)(base_policy, scn.seed, jobs)
        capacity = snap.total_gpus
        quota = {t: q * capacity * GPU_WHOLE for t, q in zip(TIERS, scn.quota, strict=True)}
        run = cls(policy_name, scn, nodes, snap, jobs, config, policy,
                  OrderedPlacer(policy, snap), preempt_mode, quota_preempt, quota, started)
        for i, j in enumerate(jobs):
            heapq.heappush(run.events, (j.arrival, 1, "arrive", i))
        return run

    # ------------------------------------------------------------ derived, cached
    @property
    def end_window(self) -> float:
        return max(j.arrival for j in self.jobs)

    @property
    def cohort(self) -> float:
        return sum(self.quota.values())

    # ------------------------------------------------------------ the event loop
    def run(self, *, drain: bool) -> None:
        end_window = self.end_window
        while self.events:
            t, _, kind, i = heapq.heappop(self.events)
            self.integrate(t)
            if kind == "arrive":
                if prepare(self.snap, self.jobs[i].gang(), self.config).impossible:
                    self.tally.rejected += 1
                else:
                    self.pending.append(i)
            elif kind == "depart":
                if self.ends_at.get(i) != t:
                    continue  # the departure of a run that was evicted
                self.depart(i)
            # "retry": only a scheduling cycle; simultaneous events coalesce before one
            if self.events and self.events[0][0] == t:
                continue
            self.cycle()
            if t <= end_window:
                self.record_series(t)
            if t > end_window and not self.pending and not drain:
                break
            if t > end_window + 72 and not (drain and self.running):
                break

    def record_series(self, t: float) -> None:
        nodes8 = [n for n in self.nodes if n.gpu_count == 8]
        self.tally.series_t.append(round(t, 4))
        self.tally.series_alloc.append(
            round(100.0 * self.tally.state["alloc"] / self.snap.total_gpus, 3))
        self.tally.series_islands.append(sum(1 for n in nodes8 if n.is_pristine()))

    def integrate(self, until: float) -> None:
        if until > self.now:
            for i in self.pending:
                for group in _groups(self.jobs[i]):
                    self.tally.waited[group][self.why.get(i, "queue")] += until - self.now
        dt = min(until, self.end_window) - self.now
        if dt > 0:
            acc, state = self.tally.acc, self.tally.state
            for key in ("alloc", "eff", "cost", "stranded"):
                acc[key] += state[key] * dt
            if any(self.jobs[i].tier == "gold" for i in self.pending):
                acc["mismatch"] += state["bronze_premium"] * dt
            acc["islands"] += sum(1 for n in self.nodes
                                  if n.gpu_count == 8 and n.is_pristine()) * dt
            cliques = {n.clique for n in self.nodes if n.clique}
            acc["cliques"] += len(self.snap.pristine_cliques() & cliques) * dt
        self.now = max(self.now, until)

    def account(self, job: Job, gang: Gang, slots: Sequence[Slot], factor: float,
                sign: int) -> None:
        state = self.tally.state
        ps = gang.pod_sets[0]
        milli = ps.gpus * ps.gpu_milli / GPU_WHOLE
        for s in slots:
            cls = self.config.hardware_class(self.snap.nodes[s.node].gpu_product) or "economy"
            state["alloc"] += sign * milli
            state["eff"] += sign * milli * factor
            state["cost"] += sign * milli * PRICE[cls]
            if job.tier == "bronze" and cls == "premium":
                state["bronze_premium"] += sign * milli
        if ps.gpus and not ps.fractional and ps.vram_mib:
            # the engine's definition (objective.stranded_vram_gib): per GPU, VRAM left
            # below the tier's utilisation line
            floor = self.config.min_vram_utilization(job.tier)
            gib = sum(max(0.0, floor * self.snap.nodes[s.node].gpu_memory_mib - ps.vram_mib)
                      for s in slots) / 1024.0
            state["stranded"] += sign * gib * ps.gpus

    def depart(self, i: int) -> None:
        self.ends_at.pop(i)
        self.run_start.pop(i)
        self.tally.completed += 1
        gang, slots, factor = self.running.pop(i)
        self.placer.undo(gang, slots)
        self.usage[self.jobs[i].tier] -= self.jobs[i].gpu_milli_total
        self.account(self.jobs[i], gang, slots, factor, -1)

    def evict(self, i: int) -> None:
        """Take job i off the cluster; its work so far is lost and it queues again."""
        job = self.jobs[i]
        gang, slots, factor = self.running.pop(i)
        self.placer.undo(gang, slots)
        self.usage[job.tier] -= job.gpu_milli_total
        self.account(job, gang, slots, factor, -1)
        start = self.run_start.pop(i)
        self.ends_at.pop(i)
        gpus = job.gpu_milli_total / GPU_WHOLE
        self.tally.acc["lost_gpu_hours"] += gpus * (self.now - start)
        # the work it did inside the window was counted as effective: take it back
        end = self.end_window
        self.tally.acc["eff"] -= gpus * factor * max(0.0, min(self.now, end) - min(start, end))
        self.pending.append(i)
        self.tally.evictions += 1

    def quota_victims(self, job: Job, need: float) -> list[int] | None:
        """Kueue's quota preemption: borrowing workloads of lower priority, lowest priority
        and most recently started first, until quota and free GPUs have room."""
        free = sum(n.free_gpu_milli for n in self.nodes)
        min_run_hours = m.REPLAY_PREEMPTION.min_run_seconds / 3600.0
        cands = sorted((k for k in self.running
                        if PRIORITY[self.jobs[k].tier] < PRIORITY[job.tier]
                        and self.usage[self.jobs[k].tier] > self.quota[self.jobs[k].tier]
                        and self.now - self.run_start[k] >= min_run_hours),
                       key=lambda k: (PRIORITY[self.jobs[k].tier], -self.run_start[k]))
        chosen: list[int] = []
        total = sum(self.usage.values())
        borrowed = {t: self.usage[t] - self.quota[t] for t in TIERS}
        for k in cands:
            if total + need <= self.cohort and need <= free:
                break
            tier = self.jobs[k].tier
            if borrowed[tier] <= 0:
                continue  # that queue no longer borrows
            chosen.append(k)
            total -= self.jobs[k].gpu_milli_total
            free += self.jobs[k].gpu_milli_total
            borrowed[tier] -= self.jobs[k].gpu_milli_total
        if total + need <= self.cohort and need <= free and chosen:
            return chosen
        return None

    # ------------------------------------------------------------ one scheduling cycle
    def cycle(self) -> None:
        """Kueue's cycle: heads in priority then FIFO order, each admitted if its quota has
        room, then placed by `decide`; at most `attempts_per_cycle` tries and one preemption
        of either kind per cycle."""
        jobs = self.jobs
        order = sorted(self.pending, key=lambda i: (-PRIORITY[jobs[i].tier], jobs[i].arrival, i))
        free_gpu = sum(n.free_gpu_milli for n in self.nodes)
        waiting = [(jobs[i].tier, jobs[i].gpu_milli_total) for i in self.pending]
        attempts = 0
        preempted = False
        for pos, i in enumerate(order):
            job, need = jobs[i], jobs[i].gpu_milli_total
            draining = [(jobs[d].tier, float(jobs[d].gpu_milli_total))
                        for d in self.drains.nodes if d != i]
            # a draining gang keeps the quota Kueue reserved for it
            fits_quota, borrow = ((True, True) if i in self.drains.nodes else quota_room(
                self.usage, self.quota, self.cohort, job.tier, need, draining))
            can_preempt = may_preempt(self.preempt_mode, job.tier, fits_quota=fits_quota,
                                      cohort_room=borrow, preempted=preempted)
            can_reclaim = self.quota_preempt and may_preempt(
                "quota", job.tier, fits_quota=fits_quota, cohort_room=borrow,
                preempted=preempted)
            if (need > free_gpu and not (can_preempt or can_reclaim)) or not (
                    fits_quota or borrow):
                self.why[i] = "quota"
                continue
            if attempts >= self.scn.attempts_per_cycle:
                self.why.update((k, "queue") for k in order[pos:])
                break
            attempts += 1
            if can_reclaim and not (borrow and need <= free_gpu):
                victims = self.quota_victims(job, need)
                if victims is not None:
                    preempted = True
                    for k in victims:
                        self.evict(k)
                        free_gpu += jobs[k].gpu_milli_total
            t0 = time.perf_counter()
            decision = decisions.decide(self.request(i, waiting, can_preempt and not preempted),
                                        self.capacity())
            self.tally.place_seconds += time.perf_counter() - t0
            self.tally.placements += 1
            placed, evicted = self.apply(i, decision)
            preempted = preempted or evicted
            free_gpu += sum(jobs[k].gpu_milli_total for k in evicted)
            if placed:
                free_gpu -= need

    def capacity(self) -> NodesKeptFree:
        return NodesKeptFree(self.snap, self.policy,
                             {self.jobs[d].name: nodes for d, nodes in self.drains.nodes.items()})

    def live_drain(self, job: int) -> LiveDrain:
        return LiveDrain(self.jobs[job].name, self.jobs[job].tier, self.drains.nodes[job])

    def request(self, i: int, waiting: Sequence[tuple[str, int]],
                may_evict: bool) -> DecisionRequest:
        job = self.jobs[i]
        return DecisionRequest(
            job.gang(waited_hours=self.now - job.arrival), self.config, waiting=waiting,
            running=lambda: [
                RunningGang(g, tuple(sl), ran_seconds=3600.0 * (self.now - self.run_start[k]),
                            priority=PRIORITY[self.jobs[k].tier])
                for k, (g, sl, _) in self.running.items()],
            drains=tuple(self.live_drain(d) for d in self.drains.nodes if d != i),
            own_drain=self.live_drain(i) if i in self.drains.nodes else None,
            may_preempt=may_evict,
        )

    def apply(self, i: int, decision: decisions.Decision) -> tuple[bool, list[int]]:
        """The decision, in memory: (placed, the jobs evicted for it)."""
        index = {j.name: k for k, j in enumerate(self.jobs)}
        if isinstance(decision, (Place, MoveOffDrain)):
            self.drains.end(i)
            self.start_job(i, decision.gang, decision.placement.slots)
            return True, []
        if isinstance(decision, PlaceOverDrains):
            for drain in decision.withdrawn:
                self.drains.end(index[drain.name])
            self.start_job(i, decision.gang, decision.placement.slots)
            return True, []
        if isinstance(decision, Preempt):
            evicted = [index[v.name] for v in decision.plan.victims]
            for k in evicted:
                self.evict(k)
            self.drains.end(i)
            self.start_job(i, decision.gang, decision.plan.placement.slots)
            return True, evicted
        if isinstance(decision, Drain):
            self.drains.start(i, frozenset(s.node for s in decision.plan.placement.slots))
            self.why[i] = "hold"
            return False, []
        if isinstance(decision, KeepDraining):
            self.why[i] = "hold"
            return False, []
        placement = decision.placement
        self.why[i] = "hold" if placement.retry_after_seconds is not None else "no room"
        if isinstance(decision, Reject):
            self.pending.remove(i)
            self.drains.end(i)
            self.tally.rejected += 1
        elif placement.retry_after_seconds is not None:
            # a deliberate hold: be back when it ends even if nothing else happens (the
            # controller's Retry is requeued on a timer the same way)
            wake = self.now + placement.retry_after_seconds / 3600.0
            if self.wake_at.get(i) != wake:
                self.wake_at[i] = wake
                heapq.heappush(self.events, (wake, 2, "retry", i))
        return False, []

    def start_job(self, i: int, gang: Gang, slots: Sequence[Slot]) -> None:
        job, snap = self.jobs[i], self.snap
        self.placer.hold(gang, slots)
        self.pending.remove(i)
        self.why.pop(i, None)
        used = {s.node for s in slots}
        tors = {snap.nodes[n].labels[TOR_LABEL] + snap.nodes[n].labels[AGG_LABEL] for n in used}
        aggs = {snap.nodes[n].labels[AGG_LABEL] for n in used}
        cl = {snap.nodes[n].clique for n in used}
        one_clique = len(cl) == 1 and None not in cl
        factor = spread_factor(job.pods * job.gpus, len(used), len(tors), len(aggs), one_clique)
        if len(used) > 1 or job.pods > 1:
            self.tally.locality.append((len(tors), len(aggs), factor))
        self.usage[job.tier] += job.gpu_milli_total
        self.running[i] = (gang, list(slots), factor)
        self.started_at.setdefault(i, self.now)
        self.run_start[i] = self.now
        self.ends_at[i] = self.now + job.duration / factor
        self.account(job, gang, slots, factor, +1)
        heapq.heappush(self.events, (self.ends_at[i], 0, "depart", i))

    # ------------------------------------------------------------ the result
    def result(self) -> ReplayResult:
        window = max(self.end_window, 1e-9)
        capacity = self.snap.total_gpus
        tally, acc = self.tally, self.tally.acc
        eff_hours = acc["eff"]
        offered = sum(j.gpu_milli_total / GPU_WHOLE * max(0.0, min(j.duration, window - j.arrival))
                      for j in self.jobs)
        multi = tally.locality

        def share(of: float) -> float:
            return round(100.0 * of / (capacity * window), 2)

        return ReplayResult(
            scenario=self.scn.name, seed=self.scn.seed, policy=self.policy_name,
            jobs=len(self.jobs), admitted=len(self.started_at), rejected=tally.rejected,
            pending_at_end=len(self.pending), hours=round(window, 2),
            seconds=round(time.perf_counter() - self.started, 2),
            place_seconds=round(tally.place_seconds, 2), placements=tally.placements,
            gpu_allocation=share(acc["alloc"]), effective_throughput=share(eff_hours),
            gpu_cost=round(acc["cost"], 1),
            cost_per_effective_gpu_hour=round(acc["cost"] / eff_hours, 3) if eff_hours else 0.0,
            tier_mismatch_gpu_hours=round(acc["mismatch"], 1),
            stranded_vram_gib_hours=round(acc["stranded"], 1),
            pristine_islands_mean=round(acc["islands"] / window, 2),
            pristine_cliques_mean=round(acc["cliques"] / window, 2),
            multinode_gangs=len(multi),
            one_tor_share=round(sum(1 for t, _, _ in multi if t == 1) / len(multi), 3)
            if multi else 0.0,
            one_agg_share=round(sum(1 for _, a, _ in multi if a == 1) / len(multi), 3)
            if multi else 0.0,
            mean_factor_multinode=round(float(np.mean([f for _, _, f in multi])), 3)
            if multi else 1.0,
            offered_load=share(offered), work_not_done=share(offered - eff_hours),
            slowdown_overhead=share(acc["alloc"] - eff_hours),
            evictions=tally.evictions, lost_gpu_hours=round(acc["lost_gpu_hours"], 1),
            completed=tally.completed, delay=self.delays(),
            wait_hours={g: {r: round(h, 2) for r, h in w.items()}
                        for g, w in sorted(tally.waited.items())},
            series_t=tally.series_t, series_alloc=tally.series_alloc,
            series_islands=tally.series_islands,
        )

    def delays(self) -> dict[str, dict[str, float]]:
        delays: dict[str, list[float]] = defaultdict(list)
        for i, j in enumerate(self.jobs):
            if i in self.started_at:
                d = self.started_at[i] - j.arrival
            elif i in self.pending:
                d = self.now - j.arrival  # still waiting: censored at the end
            else:
                continue
            delays[f"tier:{j.tier}"].append(d)
            delays[f"size:{_size_group(j)}"].append(d)
            delays["all"].append(d)
        return {k: _stats(v) for k, v in sorted(delays.items())}
