"""A placement (or a reason not to place) → what this check tells Kueue and the user.

Who calls it: `loop/`. Pure: the decision is made here, the writing is done by
`workload_check.py` and `events.py`. Ready carries the podSetUpdates that make Kueue put the
reservation label (and, when every pod of a pod set shares one domain, that domain as a
nodeSelector) on the pods; Pending says which nodes it waits for; Retry carries when to ask
again; Rejected says what to change.
The message is the one line `kubectl describe workload` shows, so it names the decision.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nexus_admit.kube import labels as L
from nexus_admit.model import ClusterSnapshot, Gang, Placement, SolveStatus

__all__ = [
    "WAITING_REASON",
    "CheckState",
    "Outcome",
    "clip",
    "common_domain",
    "passthrough",
    "placed",
    "rejected_input",
    "retry",
    "retry_backoff_seconds",
    "unplaced",
]

MESSAGE_LIMIT = 1024  # Kueue allows 32 KiB; describe output stays readable below this
DEFAULT_RETRY_SECONDS = 15
MAX_RETRY_SECONDS = 300
WAITING_REASON = "PlacementWaiting"  # the Event of a check kept Pending for nodes


class CheckState(enum.StrEnum):
    PENDING = "Pending"
    READY = "Ready"
    RETRY = "Retry"
    REJECTED = "Rejected"


@dataclass(frozen=True, slots=True)
class Outcome:
    state: CheckState
    message: str
    event_reason: str
    event_type: str = "Normal"  # Normal | Warning
    requeue_after_seconds: int | None = None
    pod_set_updates: tuple[Mapping[str, Any], ...] = field(default_factory=tuple)


def clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 1] + "…"


def retry_backoff_seconds(retry_count: int, base: int = DEFAULT_RETRY_SECONDS) -> int:
    """base × 2^retries, capped: a gang that keeps not fitting is asked about less often."""
    doublings: int = min(max(retry_count, 0), 5)
    return min(MAX_RETRY_SECONDS, base * (1 << doublings))


def common_domain(
    placement: Placement, pod_set: str, snapshot: ClusterSnapshot, levels: Sequence[str]
) -> dict[str, str]:
    """The finest topology domain (below a single host) every pod of `pod_set` sits in, as a
    nodeSelector; {} when the pods span the highest level too."""
    nodes = {s.node for s in placement.slots if s.pod_set == pod_set}
    found: dict[str, str] = {}
    for level in levels:
        if level == L.HOSTNAME_LABEL:
            break
        values = {snapshot.nodes[n].labels.get(level) for n in nodes if n in snapshot.nodes}
        if len(values) != 1 or None in values:
            break
        found = {level: str(values.pop())}
    return found


def _domains(placement: Placement, snapshot: ClusterSnapshot, levels: Sequence[str]) -> str:
    """Where the pods are, highest level first: the domain's name when all share one, a few
    names joined by "+", else a count ("zone-a › h100-b0 › 2 gce-topology-subblock")."""
    nodes = {s.node for s in placement.slots}
    parts = []
    for level in levels:
        if level == L.HOSTNAME_LABEL:
            break
        values = sorted(
            {snapshot.nodes[n].labels.get(level, "?") for n in nodes if n in snapshot.nodes}
        )
        if not values:
            continue
        short = level.rsplit("/", 1)[-1]
        parts.append(
            f"{short} {'+'.join(values)}" if len(values) <= 2 else f"{len(values)} {short}s"
        )
    return " › ".join(parts)


def _hardware(
    placement: Placement,
    snapshot: ClusterSnapshot,
    hardware_class: Callable[[str], str | None] | None,
) -> str:
    """The hardware classes the pods landed on (the GPU products without a config)."""
    products = {
        snapshot.nodes[s.node].gpu_product or "cpu"
        for s in placement.slots
        if s.node in snapshot.nodes
    }
    if hardware_class is not None:
        products = {hardware_class(p) or p for p in products}
    return "/".join(sorted(products)) or "?"


def placed(
    placement: Placement,
    gang: Gang,
    reservation: str,
    snapshot: ClusterSnapshot,
    levels: Sequence[str],
    *,
    hardware_class: Callable[[str], str | None] | None = None,
) -> Outcome:
    """Ready. The message leads with one line a person reads (how many pods where, the
    domains, tier → hardware class, the reservation), then the engine's explanation and
    terms. `hardware_class` (PlacementConfig.hardware_class) names the class; without it
    the GPU products are named."""
    updates = []
    for ps in gang.pod_sets:
        update: dict[str, Any] = {"name": ps.name, "labels": {L.LABEL_RESERVATION: reservation}}
        selector = common_domain(placement, ps.name, snapshot, levels)
        if selector:
            update["nodeSelector"] = selector
        updates.append(update)
    nodes = len({s.node for s in placement.slots})
    head = f"placed {len(placement.slots)} pods on {nodes} nodes (reservation {reservation})"
    where = _domains(placement, snapshot, levels)
    lead = (
        f"{head}{' in ' + where if where else ''}; "
        f"tier {gang.tier} → {_hardware(placement, snapshot, hardware_class)}."
    )
    details = "; ".join(placement.explanation)
    return Outcome(
        CheckState.READY,
        clip(f"{lead} Why: {details}" if details else lead),
        "Placed",
        pod_set_updates=tuple(updates),
    )


def unplaced(placement: Placement, retry_count: int, base_seconds: int) -> Outcome:
    """Pending while no node it may use is schedulable now (cordoned, tainted, NotReady,
    not there yet): Retry would evict it and give up its quota for a wait no backoff
    shortens. Retry when it may fit later (capacity, fragmentation, a locality hold);
    Rejected when it never can (e.g. no GPU has the VRAM it asks for)."""
    if placement.status is SolveStatus.UNAVAILABLE:
        return Outcome(
            CheckState.PENDING,
            clip(f"waiting for nodes: {placement.reason}"),
            WAITING_REASON,
            "Normal",
        )
    if placement.retryable:
        if placement.retry_after_seconds is not None:
            after = max(1, round(placement.retry_after_seconds))
        else:
            after = retry_backoff_seconds(retry_count, base_seconds)
        return Outcome(
            CheckState.RETRY,
            clip(f"cannot place now, retry in {after}s: {placement.reason}"),
            "PlacementRetry",
            "Normal",
            requeue_after_seconds=after,
        )
    return Outcome(
        CheckState.REJECTED,
        clip(f"cannot ever be placed: {placement.reason}"),
        "PlacementRejected",
        "Warning",
    )


def rejected_input(error: Exception) -> Outcome:
    """Malformed input (an annotation, a request, a broken config): tell the user what."""
    return Outcome(
        CheckState.REJECTED,
        clip(f"invalid workload: {error}"),
        "PlacementRejected",
        "Warning",
    )


def passthrough(pod_sets: Sequence[str]) -> Outcome:
    """Pod sets on a Kueue TAS flavor: Kueue already chose their hosts; nexus does not pin."""
    return Outcome(
        CheckState.READY,
        clip(
            f"not pinned: pod sets {', '.join(pod_sets)} use a topology-aware flavor, whose "
            "hosts Kueue's own TAS chose at quota reservation"
        ),
        "Placed",
    )


def retry(message: str, after_seconds: int, reason: str = "PlacementRetry") -> Outcome:
    """Back through Retry (Kueue releases the quota and requeues after `after_seconds`):
    a Warning, since something the user or admin may act on stopped the placement."""
    return Outcome(CheckState.RETRY, message, reason, "Warning",
                   requeue_after_seconds=after_seconds)
