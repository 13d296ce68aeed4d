"""The benchmark's Workloads: the same for the same seed, within each pool's budget, and
their Jobs shaped as both phases need them."""

from __future__ import annotations

import fleet as fleet_mod  # e2e/fleet.py, on the path through conftest.py
import yaml
from bench_e2e import queues
from bench_e2e import workloads as wl

POOLS_1000 = {"gold": 4032, "silver": 1984, "bronze": 992}


def test_same_seed_same_workloads_other_seed_others():
    a = wl.generate(300, 7, POOLS_1000, burst=100, stream_per_s=4)
    b = wl.generate(300, 7, POOLS_1000, burst=100, stream_per_s=4)
    c = wl.generate(300, 8, POOLS_1000, burst=100, stream_per_s=4)
    assert a == b
    assert a != c


def test_shapes_tiers_and_arrivals():
    works = wl.generate(300, 1, POOLS_1000, burst=100, stream_per_s=4)
    assert {w.pods for w in works} == {1, 8, 32}
    assert {w.tier for w in works} == set(wl.TIERS)
    assert len({w.name for w in works}) == 300
    assert [w.arrival_s for w in works[:100]] == [0.0] * 100
    stream = [w.arrival_s for w in works[100:]]
    assert stream == sorted(stream) and stream[0] == 0.25 and stream[-1] == 50.0


def test_each_tier_stays_within_its_pool_budget():
    pools = {"gold": 384, "silver": 192, "bronze": 96}
    works = wl.generate(60, 3, pools, burst=20, stream_per_s=4)
    for tier, gpus in wl.demand_by_tier(works).items():
        ones = sum(w.gpus == 1 for w in works if w.tier == tier)
        # only 1-GPU gangs (which cannot shrink) may go past the budget
        assert gpus <= int(pools[tier] * wl.POOL_BUDGET) + ones, tier


def test_without_a_budget_nothing_shrinks():
    capped = wl.generate(500, 2, {"gold": 8, "silver": 8, "bronze": 8}, burst=0, stream_per_s=1)
    free = wl.generate(
        500, 2, {"gold": 8, "silver": 8, "bronze": 8}, burst=0, stream_per_s=1, pool_budget=None
    )
    assert sum(w.gpus for w in free) > sum(w.gpus for w in capped)
    assert any(w.pods == 32 for w in free)


def test_job_manifest():
    w = wl.BenchWorkload("wl-0001-gold-8x4", "gold", 8, 4, 0.0)
    job = wl.job_manifest(w, "gold", rack_preference=True)
    spec = job["spec"]
    assert job["metadata"]["labels"][wl.QUEUE_LABEL] == "gold"
    assert (spec["parallelism"], spec["completions"], spec["completionMode"]) == (8, 8, "Indexed")
    tmpl = spec["template"]
    assert tmpl["metadata"]["labels"][wl.WORKLOAD_LABEL] == w.name
    assert tmpl["metadata"]["annotations"] == {wl.PREFERRED_TOPOLOGY: wl.RACK_LABEL}
    assert tmpl["spec"]["containers"][0]["resources"]["limits"] == {wl.GPU: "4"}
    soak = wl.job_manifest(w, "nexus-gold", complete_after="30s", ttl_after_finished_s=0)
    assert soak["spec"]["template"]["metadata"]["annotations"] == {wl.POD_COMPLETE_DELAY: "30s"}
    assert soak["spec"]["ttlSecondsAfterFinished"] == 0
    single = wl.BenchWorkload("wl-0002-gold-1x8", "gold", 1, 8, 0.0)
    assert not wl.job_manifest(single, "gold", rack_preference=True)["spec"]["template"][
        "metadata"
    ]["annotations"]


def test_fleet_scales_and_queues_follow_it():
    spec = fleet_mod.scaled(fleet_mod.load(), 1000)
    nodes = fleet_mod.expand(spec)
    assert len(nodes) == 1000
    assert {n.pool for n in nodes} == {"h100", "a100", "l40s"}
    pools = queues.pool_quotas(nodes)
    assert queues.tier_pool_gpus(pools) == POOLS_1000
    cqs = {cq["metadata"]["name"]: cq for cq in queues.cluster_queues(pools)}
    assert set(cqs) == {
        queues.INSTANT_CHECK,  # the instant check's AdmissionCheck, then the queues
        *(f"{prefix}{tier}" for prefix in ("", "nexus-", "instant-")
          for tier in ("gold", "silver", "bronze")),
    }
    gold = cqs["gold"]["spec"]["resourceGroups"][0]["flavors"][0]
    assert gold["name"] == "h100"
    assert {"name": "nvidia.com/gpu", "nominalQuota": "4032"} in gold["resources"]
    nexus = cqs["nexus-bronze"]["spec"]
    assert nexus["admissionChecksStrategy"]["admissionChecks"] == [{"name": "nexus-placement"}]
    assert {"name": "nvidia.com/gpu", "nominalQuota": "7008"} in nexus["resourceGroups"][0][
        "flavors"
    ][0]["resources"]
    # the queues are what Kueue's manifests would carry: valid YAML round trip
    assert yaml.safe_load(yaml.safe_dump(cqs["gold"])) == cqs["gold"]
    # the 64 GPU nodes of the tests' fleet are unchanged by scaling to their own size
    gpu_pools = {k: v for k, v in fleet_mod.summary().items() if v["gpus"]}
    assert fleet_mod.summary(fleet_mod.scaled(fleet_mod.load(), 64)) == gpu_pools
