"""Every metric the controller exports, defined once, on a registry of its own.

Who calls it: `context.py` creates one `Metrics`; the loop, the ungater, the webhook and the
lag probe record into it; `operator.py` serves it on /metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]

_P = "nexus_admit_"
# a one-pod decision takes 0.5-10 ms: fine steps there, so a p99 read from the buckets
# (the load benchmark compares fleets by it) is not a guess across 5 ms
_SOLVE_BUCKETS = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015,
                  0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self._placement_metrics(self.registry)
        self._runtime_metrics(self.registry)

    def _placement_metrics(self, r: CollectorRegistry) -> None:
        """What placing decides and holds: solves, placements, reservations, GPUs, demand."""
        self.solve_seconds = Histogram(
            _P + "solve_seconds",
            "Engine time per placement, by outcome, gang size (pods: 1 or several; a "
            "one-pod decision should cost the same on any fleet size) and facts (kept: "
            "reused from earlier decisions; fleet: derived over every candidate node, as "
            "the first decision of a pod shape or one after a snapshot renewal does).",
            ["outcome", "pods", "facts"],
            buckets=_SOLVE_BUCKETS,
            registry=r,
        )
        self.solve_cpu_seconds = Histogram(
            _P + "solve_cpu_seconds",
            "CPU time of the solving thread per placement, by outcome, gang size and facts: "
            "the decision's own cost, without the time it waited for a core or the GIL.",
            ["outcome", "pods", "facts"],
            buckets=_SOLVE_BUCKETS,
            registry=r,
        )
        self.reservation_wait_seconds = Histogram(
            _P + "reservation_wait_seconds",
            "How long placing waited for a reservation create to come back, once per "
            "create (--creates-in-flight of them overlap the next solves).",
            buckets=_SOLVE_BUCKETS,
            registry=r,
        )
        self.warmed_shapes = Counter(
            _P + "warmed_shapes",
            "Pod shapes of Workloads waiting for quota whose placement facts were derived "
            "ahead, so their decision costs only what changed since.",
            registry=r,
        )
        self.placements = Counter(
            _P + "placements", "Placement decisions written, by outcome.", ["outcome"], registry=r
        )
        self.reservations = Gauge(
            _P + "reservations", "ResourceReservations by phase.", ["phase"], registry=r
        )
        self.gpus = Gauge(
            _P + "ledger_gpus",
            "GPU devices by state: free, reserved (slots whose pods are "
            "not bound), bound (pods running on them).",
            ["state"],
            registry=r,
        )
        self.pristine_islands = Gauge(
            _P + "pristine_islands", "Fully free 8-GPU nodes (islands).", registry=r
        )
        self.pending_gpus = Gauge(
            _P + "pending_gpus",
            "GPUs of Workloads queued on our checks, not yet admitted, "
            "by the tier of their ClusterQueue.",
            ["tier"],
            registry=r,
        )

    def _loop_metrics(self, r: CollectorRegistry) -> None:
        """The event loop's lag, the collector's pauses and the passes."""
        self.loop_lag_seconds = Histogram(
            _P + "event_loop_lag_seconds",
            "How late a 0.25 s timer fires on the event loop.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.gc_pause_seconds = Histogram(
            _P + "gc_pause_seconds",
            "Garbage collections, by generation: every thread waits while one runs "
            "(2: a full walk of the heap not frozen, see --heap-freeze-seconds).",
            ["generation"],
            buckets=(0.0001, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.snapshot_renewals = Counter(
            _P + "snapshot_renewals",
            "Builds of the passes' snapshot of the fleet that dropped what the engine "
            "derived from node labels (its next solve derives it again, O(fleet)), by "
            "reason: first, "
            "nodes-dropped, log-full, epoch (a placement config), membership (a node joined "
            "or left), static (a node's labels, taints or allocatable), topologies.",
            ["reason"],
            registry=r,
        )
        self.pass_seconds = Histogram(
            _P + "reconcile_seconds",
            "One reconcile pass (releases, placements, ungating).",
            buckets=_SOLVE_BUCKETS,
            registry=r,
        )

    def _runtime_metrics(self, r: CollectorRegistry) -> None:
        """The other steps and the runtime: ungating, the webhook, the loop and its passes,
        preemption, relists, leadership, certificates, errors (registered in this order)."""
        self.ungate_seconds = Histogram(
            _P + "ungate_seconds",
            "Pod creation to the removal of the placement gate.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.webhook_requests = Counter(
            _P + "webhook_requests", "Pod admission requests, by answer.", ["answer"], registry=r
        )
        self._loop_metrics(r)
        self.preemptions = Counter(
            _P + "preemptions",
            "Placement-level preemption: preemptors placed, victims evicted, drains started, "
            "given way and left for a place that fits, preemptions given up.",
            ["role"],
            registry=r,
        )
        self.relists = Counter(
            _P + "relists",
            "Re-lists of the store completed: of every watched kind (start-up, takeover, after "
            "a failed step, the safety period), or of a kind whose watch found a gap (410 Gone).",
            registry=r,
        )
        self.watch_gaps = Counter(
            _P + "watch_gaps",
            "Watch gaps, by kind: the apiserver no longer had the version a watch resumed "
            "from (410 Gone), so the kind was listed again (objects deleted in the gap "
            "leave the store).",
            ["kind"],
            registry=r,
        )
        self.watch_reconnects = Counter(
            _P + "watch_reconnects",
            "Watch streams that broke off (a lost connection, the apiserver down) and were "
            "resumed from the last version seen, by kind.",
            ["kind"],
            registry=r,
        )
        self.leader = Gauge(
            _P + "leader",
            "1 while this replica acts on Workloads (holds the leader Lease, or runs "
            "without leader election), else 0.",
            registry=r,
        )
        self.certificate_reloads = Counter(
            _P + "webhook_certificate_reloads",
            "New serving certificates loaded by the webhook without a restart.",
            registry=r,
        )
        self.objects_skipped = Counter(
            _P + "objects_skipped",
            "Objects a pass left out because a field could not be read (an Event on the "
            "object, or on the Workload of a reservation, names the field), by kind and reason.",
            ["kind", "reason"],
            registry=r,
        )
        self.errors = Counter(
            _P + "errors", "Failures of a step, retried on the next pass.", ["step"], registry=r
        )
