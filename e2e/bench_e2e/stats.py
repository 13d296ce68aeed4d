"""Figures from recorded timestamps and scraped Prometheus text; no cluster access here."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class WorkloadTimes:
    """Client-side wall-clock times (time.time()) of one Workload's milestones."""

    pods: int
    created: float | None = None  # the Job create call returned
    workload_seen: float | None = None  # Kueue's Workload for it first seen
    quota_reserved: float | None = None
    check_ready: float | None = None  # our AdmissionCheck Ready (nexus phase only)
    admitted: float | None = None
    unsuspended: float | None = None  # Kueue unsuspended the Job
    pod_created: dict[str, float] = field(default_factory=dict)  # pod name -> first seen
    pod_gated: set[str] = field(default_factory=set)  # seen with a scheduling gate
    pod_ungated: dict[str, float] = field(default_factory=dict)  # gates seen gone
    pod_bound: dict[str, float] = field(default_factory=dict)  # nodeName seen
    pod_running: dict[str, float] = field(default_factory=dict)  # Running seen

    def all_running(self) -> float | None:
        """When the last of its pods was seen Running (None until all were)."""
        return self._last(self.pod_running)

    def all_bound(self) -> float | None:
        """When the last of its pods was seen bound (None until all were)."""
        return self._last(self.pod_bound)

    def _first(self, stamps: Mapping[str, float]) -> float | None:
        return min(stamps.values(), default=None)

    def timeline(self, t0: float) -> dict[str, float | None]:
        """Its milestones in seconds since `t0` (the phase's start), for plots and triage."""

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 3)

        return {
            "created": rel(self.created),
            "workload_seen": rel(self.workload_seen),
            "quota_reserved": rel(self.quota_reserved),
            "check_ready": rel(self.check_ready),
            "admitted": rel(self.admitted),
            "unsuspended": rel(self.unsuspended),
            "first_pod_created": rel(self._first(self.pod_created)),
            "all_pods_created": rel(self._last(self.pod_created)),
            "all_running": rel(self.all_running()),
        }

    def _last(self, stamps: Mapping[str, float]) -> float | None:
        return max(stamps.values()) if len(stamps) >= self.pods else None

    def stages(self) -> dict[str, float]:
        """Seconds spent in each step, for the steps both ends of which were seen."""
        marks = [
            ("create→quota reserved", self.created, self.quota_reserved),
            ("quota reserved→check Ready", self.quota_reserved, self.check_ready),
            (
                "check Ready→admitted" if self.check_ready else "quota reserved→admitted",
                self.check_ready or self.quota_reserved,
                self.admitted,
            ),
            ("admitted→Job unsuspended", self.admitted, self.unsuspended),
            ("Job unsuspended→first pod created", self.unsuspended, self._first(self.pod_created)),
            ("first→all pods created", self._first(self.pod_created), self._last(self.pod_created)),
            (
                "all pods created→all ungated",
                self._last(self.pod_created),
                self._last(self.pod_ungated),
            ),
            ("all ungated→all bound", self._last(self.pod_ungated), self.all_bound()),
            ("all bound→all Running", self.all_bound(), self.all_running()),
        ]
        return {name: b - a for name, a, b in marks if a is not None and b is not None}


def create_to_running(times: Iterable[WorkloadTimes]) -> list[float]:
    return [
        t.all_running() - t.created  # type: ignore[operator]
        for t in times
        if t.created is not None and t.all_running() is not None
    ]


def create_to_bound(times: Iterable[WorkloadTimes]) -> list[float]:
    """Create → its last pod bound: the last step the real stack takes (Running is KWOK's
    play of the kubelet, which has lagged by tens of seconds in either phase)."""
    return [
        bound - t.created
        for t in times
        if t.created is not None and (bound := t.all_bound()) is not None
    ]


def ungate_latencies(times: Iterable[WorkloadTimes]) -> list[float]:
    """Per pod that was seen gated: first seen (created) to its gates seen gone."""
    return [
        t.pod_ungated[p] - t.pod_created[p]
        for t in times
        for p in t.pod_gated
        if p in t.pod_ungated and p in t.pod_created
    ]


def throughput(starts: Iterable[float | None], ends: Iterable[float | None]) -> float | None:
    """Workloads per second: those that reached the end mark, over the span from the first
    start to the last end."""
    s = [x for x in starts if x is not None]
    e = [x for x in ends if x is not None]
    if not s or not e:
        return None
    span = max(e) - min(s)
    return len(e) / span if span > 0 else None


def stage_summary(times: Iterable[WorkloadTimes]) -> dict[str, dict[str, float | None]]:
    """p50/p99 of every stage over the Workloads."""
    per: dict[str, list[float]] = {}
    for t in times:
        for name, secs in t.stages().items():
            per.setdefault(name, []).append(secs)
    return {
        name: {"p50": percentile(v, 50), "p99": percentile(v, 99), "n": len(v)}
        for name, v in per.items()
    }


# ------------------------------------------------------------------ Prometheus histograms

Buckets = dict[float, float]  # upper bound (le) -> cumulative count


def histogram_buckets(text: str, name: str, match: Mapping[str, str] | None = None) -> Buckets:
    """The cumulative buckets of histogram `name` in Prometheus text, summed over every
    series whose labels include `match`."""
    out: Buckets = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name != name + "_bucket":
                continue
            if match and any(s.labels.get(k) != v for k, v in match.items()):
                continue
            le = float(s.labels["le"])
            out[le] = out.get(le, 0.0) + s.value
    return out


def histogram_sum(text: str, name: str, match: Mapping[str, str] | None = None) -> float:
    """The `_sum` of histogram `name` in Prometheus text, over every series whose labels
    include `match`."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name + "_sum"
        and not (match and any(s.labels.get(k) != v for k, v in match.items()))
    )


def counter_delta(
    after: str, before: str, name: str, by: tuple[str, ...]
) -> dict[tuple[str, ...], float]:
    """Counter `name` increased between two scrapes, summed per value of the labels `by`."""

    def sums(text: str) -> dict[tuple[str, ...], float]:
        out: dict[tuple[str, ...], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in (name, name + "_total"):
                    key = tuple(s.labels.get(k, "") for k in by)
                    out[key] = out.get(key, 0.0) + s.value
        return out

    b = sums(before)
    return {k: v - b.get(k, 0.0) for k, v in sums(after).items() if v - b.get(k, 0.0) > 0}


def histogram_label_values(text: str, name: str, label: str) -> set[str]:
    return {
        s.labels[label]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name + "_bucket" and label in s.labels
    }


def bucket_delta(after: Buckets, before: Buckets) -> Buckets:
    """What was observed between two scrapes of the same histogram."""
    return {le: after[le] - before.get(le, 0.0) for le in after}


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket holding the q-th observation
    (0 < q < 1); the highest finite bound when it falls in +Inf; None with no observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if math.isinf(le):
                finite = [b for b in bounds if not math.isinf(b)]
                return finite[-1] if finite else None
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return None


def histogram_count(buckets: Buckets) -> float:
    return max(buckets.values(), default=0.0)


def cpu_by_process(
    before: Mapping[str, float | None], after: Mapping[str, float | None], wall_s: float
) -> dict[str, dict[str, float]]:
    """CPU seconds each process used between two readings, and its share of one core over
    `wall_s`; a process missing from either reading (not running then) is left out."""
    out = {}
    for name, end in after.items():
        start = before.get(name)
        if start is None or end is None:
            continue
        used = max(0.0, end - start)
        out[name] = {
            "cpu_s": round(used, 1),
            "core_percent": round(100 * used / wall_s, 1) if wall_s > 0 else 0.0,
        }
    return out


def busy_percent(used: Mapping[str, Mapping[str, float]], leave_out: str) -> float:
    """The share of one core the processes of `used` (`cpu_by_process`'s result) took
    together, without `leave_out` (the benchmark's own process)."""
    return sum(u["core_percent"] for name, u in used.items() if name != leave_out)


# ------------------------------------------------------------------ per Workload, start-up

ALL_BUT_BENCH = "total (all but this benchmark)"


def cpu_per_workload(
    cpu: Mapping[str, Mapping[str, float]], admitted: int, leave_out: str
) -> dict[str, float]:
    """CPU seconds per admitted Workload of each process in `cpu` (`cpu_by_process`'s
    result), and their total without `leave_out` (the benchmark's own process: it watches,
    it is not part of the system measured); empty when nothing was admitted."""
    if admitted <= 0:
        return {}
    out = {name: round(u["cpu_s"] / admitted, 4) for name, u in cpu.items()}
    out[ALL_BUT_BENCH] = round(
        sum(u["cpu_s"] for name, u in cpu.items() if name != leave_out) / admitted, 4
    )
    return out


def cpu_per_workload_beyond_idle(
    cpu: Mapping[str, Mapping[str, float]],
    idle: Mapping[str, Mapping[str, float]],
    wall_s: float,
    admitted: int,
    leave_out: str,
) -> dict[str, float]:
    """`cpu_per_workload` less what each process would have used over the phase's `wall_s`
    at its idle rate (`idle`: `cpu_by_process` over a quiet spell just before the phase):
    the work the Workloads made, apart from what a longer phase costs by itself (periodic
    resyncs, watch bookmarks, lease renewals). A process without an idle reading is left
    out; a negative value is what it is (noise), not clipped."""
    if admitted <= 0:
        return {}
    beyond = {
        name: {"cpu_s": u["cpu_s"] - idle[name]["core_percent"] / 100 * wall_s}
        for name, u in cpu.items()
        if name in idle
    }
    out = {name: round(u["cpu_s"] / admitted, 4) for name, u in beyond.items()}
    out[ALL_BUT_BENCH] = round(
        sum(u["cpu_s"] for name, u in beyond.items() if name != leave_out) / admitted, 4
    )
    return out


def cpu_share(without: Mapping[str, float], with_: Mapping[str, float]) -> dict[str, float | None]:
    """Per process, CPU seconds per Workload with nexus minus without: what nexus adds, its
    controller's own and what it makes the others do. A process absent without nexus (the
    controller) used nothing there; one absent with nexus was not measured (None)."""
    names = list(with_) + [n for n in without if n not in with_]
    return {n: round(with_[n] - without.get(n, 0.0), 4) if n in with_ else None for n in names}


def first_decision(
    started: float,
    serving: float | None,
    synced: float | None,
    times: Iterable[WorkloadTimes],
) -> dict[str, float | None]:
    """Seconds from the controller's process start (`started`) to its webhook serving, its
    store synced, the phase's first Workload created and the first check Ready (its first
    decision), and that decision's delay after its own Workload's creation."""
    ts = list(times)
    created = [t.created for t in ts if t.created is not None]
    decided = [t for t in ts if t.check_ready is not None]
    first = min(decided, key=lambda t: t.check_ready or 0.0, default=None)

    def since(t: float | None) -> float | None:
        return None if t is None else round(t - started, 3)

    own = (
        round(first.check_ready - first.created, 3)  # type: ignore[operator]
        if first is not None and first.created is not None
        else None
    )
    return {
        "webhook_serving_s": since(serving),
        "store_synced_s": since(synced),
        "first_workload_created_s": since(min(created, default=None)),
        "first_check_ready_s": since(first.check_ready if first else None),
        "first_decision_after_its_create_s": own,
    }


def lease_renewals_due(leases: Iterable[tuple[float, float]], now: float) -> list[float]:
    """Seconds until each node lease is renewed next, from (renewTime, leaseDurationSeconds):
    KWOK renews every quarter of the duration (plus up to 4 % jitter), as kubelets do;
    negative: due or late (a round of renewals under way)."""
    return [renewed + duration / 4 - now for renewed, duration in leases]


def lease_wait(due: Sequence[float], needed_s: float) -> float | None:
    """How long to sleep before looking at the node leases again so that the next round of
    renewals is at least `needed_s` away (`due`: `lease_renewals_due`); None: it is now.
    A round under way (a lease late) is looked at again in 2 s; else until it starts."""
    soonest = min(due, default=math.inf)
    if soonest >= needed_s:
        return None
    return 2.0 if soonest < 0 else min(soonest + 1, 30.0)


def kwok_plays_failed(log: str, namespace: str) -> dict[str, int]:
    """KWOK's failed plays of a pod stage for pods of `namespace` in a stretch of its log.

    `refused_replays`: plays on an old copy of a pod that the apiserver refused as out of
    date (409), which the benchmark's plane asks for (plane/components.played_once);
    `failed`: every other failure (in v0.8.0 a replayed pod-ready with a second pod IP was
    refused with 422, 1,545 and 1,685 times in a phase of two runs, in which all bound →
    all Running grew to tens of seconds). KWOK plays neither again.
    """
    mark = f'"pod":"{namespace}/'
    failed = refused = 0
    for line in log.splitlines():
        if "failed to apply stage" not in line or mark not in line:
            continue
        if "the object has been modified" in line:
            refused += 1
        else:
            failed += 1
    return {"failed": failed, "refused_replays": refused}


def kwok_status_patches(log: str, namespace: str) -> dict[str, int]:
    """How many times KWOK patched each pod of `namespace` in a stretch of its log: a pod
    played twice (a replay on an old copy of it) counts 2."""
    mark = f'"pod":"{namespace}/'
    patches: dict[str, int] = {}
    for line in log.splitlines():
        if '"msg":"Patch pod"' in line and mark in line:
            pod = line.split(mark, 1)[1].split('"', 1)[0]
            patches[pod] = patches.get(pod, 0) + 1
    return patches
