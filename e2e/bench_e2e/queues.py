"""ClusterQueues with quotas sized to the benchmark's fleet.

Same names and shape as e2e/manifests/kueue.yaml (gold/silver/bronze on the per-model
flavors, gold on the topology-aware h100 flavor) and e2e/manifests/nexus.yaml
(nexus-gold/silver/bronze on the broad flavor `gpu-any` with the nexus-placement check);
only the quotas grow with the fleet. instant-gold/silver/bronze are the Kueue-alone queues
with the benchmark's instant check (bench_e2e/instant_check.py): the floor of any check.
Applied on the benchmark's own cluster, over the 64-node quotas those manifests carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nexus_admit.kube import labels as L

# tier -> (pool, flavor) of the Kueue-alone ClusterQueue (e2e/manifests/kueue.yaml)
KUEUE_ALONE = {"gold": ("h100", "h100"), "silver": ("a100", "a100"), "bronze": ("l40s", "l40s")}
# tiers whose Kueue-alone flavor is topology-aware (h100 has topologyName gpu-fabric): only
# their gangs may ask Kueue TAS for a rack; on the other flavors Kueue refuses the request
TAS_TIERS = ("gold",)
NEXUS_CHECK = "nexus-placement"
INSTANT_CHECK = "bench-instant"  # bench_e2e/instant_check.py answers it
INSTANT_PREFIX = "instant-"
INSTANT_CONTROLLER = "bench.kubenexus.io/instant-check"
NEXUS_FLAVOR = "gpu-any"
TIER_LABEL = L.LABEL_TIER


def _cq(
    name: str, tier: str, flavor: str, quota: Mapping[str, int], check: str | None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": [
            {
                "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                "flavors": [
                    {
                        "name": flavor,
                        "resources": [
                            {"name": "cpu", "nominalQuota": str(quota["cpu"])},
                            {"name": "memory", "nominalQuota": f"{quota['memoryGi']}Gi"},
                            {"name": "nvidia.com/gpu", "nominalQuota": str(quota["gpus"])},
                        ],
                    }
                ],
            }
        ],
    }
    if check:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name, "labels": {TIER_LABEL: tier}},
        "spec": spec,
    }


def instant_admission_check() -> dict[str, Any]:
    """The instant check's AdmissionCheck; its controller marks it Active when it starts."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": INSTANT_CHECK},
        "spec": {"controllerName": INSTANT_CONTROLLER},
    }


def pool_quotas(nodes: list[Any]) -> dict[str, dict[str, int]]:
    """{pool: {cpu, memoryGi, gpus}} summed over fleet.expand() nodes."""
    out: dict[str, dict[str, int]] = {}
    for n in nodes:
        q = out.setdefault(n.pool, {"cpu": 0, "memoryGi": 0, "gpus": 0})
        q["cpu"] += int(n.allocatable["cpu"])
        mem = n.allocatable["memory"]
        q["memoryGi"] += int(mem[:-2]) * (1024 if mem.endswith("Ti") else 1)
        q["gpus"] += n.gpus
    return out


def cluster_queues(pools: Mapping[str, Mapping[str, int]]) -> list[dict[str, Any]]:
    """Kueue-alone queues get their pool, and so do the instant check's (the same queues
    with a check, so that the check is all that differs; on the broad flavor Kueue would
    admit what kube-scheduler's spreading then leaves no whole node for); the nexus queues
    each get the whole fleet (as in nexus.yaml: nexus, not the flavor, picks the
    hardware)."""
    fleet = {k: sum(p[k] for p in pools.values()) for k in ("cpu", "memoryGi", "gpus")}
    out = [instant_admission_check()]
    for prefix, check in (("", None), (INSTANT_PREFIX, INSTANT_CHECK)):
        out += [
            _cq(f"{prefix}{tier}", tier, flavor, pools[pool], check)
            for tier, (pool, flavor) in KUEUE_ALONE.items()
        ]
    out += [_cq(f"nexus-{tier}", tier, NEXUS_FLAVOR, fleet, NEXUS_CHECK) for tier in KUEUE_ALONE]
    return out


def tier_pool_gpus(pools: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    """GPUs of each tier's Kueue-alone pool (what the workload generator budgets against)."""
    return {tier: pools[pool]["gpus"] for tier, (pool, _) in KUEUE_ALONE.items()}
