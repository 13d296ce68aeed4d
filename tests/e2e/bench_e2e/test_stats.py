"""Figures computed from recorded timestamps and Prometheus text."""

from __future__ import annotations

import math

import pytest
from bench_e2e import stats

PROM = """\
# HELP webhook_seconds x
# TYPE webhook_seconds histogram
webhook_seconds_bucket{name="a",operation="CREATE",le="0.025"} 80
webhook_seconds_bucket{name="a",operation="CREATE",le="0.1"} 99
webhook_seconds_bucket{name="a",operation="CREATE",le="+Inf"} 100
webhook_seconds_sum{name="a",operation="CREATE"} 3
webhook_seconds_count{name="a",operation="CREATE"} 100
webhook_seconds_bucket{name="b",operation="CREATE",le="0.025"} 5
webhook_seconds_bucket{name="b",operation="CREATE",le="0.1"} 5
webhook_seconds_bucket{name="b",operation="CREATE",le="+Inf"} 5
webhook_seconds_sum{name="b",operation="CREATE"} 0.1
webhook_seconds_count{name="b",operation="CREATE"} 5
"""
METRIC = "webhook_seconds"


def test_percentile_interpolates_like_numpy():
    assert stats.percentile([], 50) is None
    assert stats.percentile([3.0], 99) == 3.0
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert stats.percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)


def test_histogram_buckets_filter_and_sum():
    a = stats.histogram_buckets(PROM, METRIC, {"name": "a"})
    assert a == {0.025: 80, 0.1: 99, math.inf: 100}
    both = stats.histogram_buckets(PROM, METRIC)
    assert both[0.025] == 85 and both[math.inf] == 105
    assert stats.histogram_label_values(PROM, METRIC, "name") == {"a", "b"}


def test_histogram_sum_adds_every_series():
    assert stats.histogram_sum(PROM, METRIC) == pytest.approx(3.1)
    assert stats.histogram_sum(PROM, "absent_seconds") == 0


def test_histogram_quantile_and_deltas():
    a = stats.histogram_buckets(PROM, METRIC, {"name": "a"})
    # rank 50 of 100 falls in the first bucket: 0 + 0.025 * 50/80
    assert stats.histogram_quantile(0.5, a) == pytest.approx(0.025 * 50 / 80)
    # rank 99: the top of the (0.025, 0.1] bucket
    assert stats.histogram_quantile(0.99, a) == pytest.approx(0.1)
    # rank 99.5 lands in +Inf: the highest finite bound
    assert stats.histogram_quantile(0.995, a) == 0.1
    assert stats.histogram_quantile(0.5, {}) is None
    before = {0.025: 70.0, 0.1: 70.0, math.inf: 70.0}
    delta = stats.bucket_delta(a, before)
    assert delta == {0.025: 10, 0.1: 29, math.inf: 30}
    assert stats.histogram_count(delta) == 30
    assert stats.histogram_quantile(0.5, delta) == pytest.approx(0.025 + 0.075 * 5 / 19)


def gang(created: float, running: list[float], **marks: float) -> stats.WorkloadTimes:
    t = stats.WorkloadTimes(pods=len(running), created=created, **marks)
    for i, r in enumerate(running):
        t.pod_created[f"p{i}"] = created + 1
        t.pod_gated.add(f"p{i}")
        t.pod_ungated[f"p{i}"] = created + 2 + i
        t.pod_bound[f"p{i}"] = created + 3 + i
        t.pod_running[f"p{i}"] = r
    return t


def test_create_to_running_is_the_last_pod_and_needs_all():
    done = gang(10.0, [14.0, 16.0])
    half = stats.WorkloadTimes(pods=2, created=10.0, pod_running={"p0": 12.0})
    assert stats.create_to_running([done, half]) == [6.0]
    assert half.all_running() is None
    assert stats.create_to_bound([done, half]) == [4.0], "the last pod bound at 14.0"


def test_throughput_counts_what_reached_the_end():
    assert stats.throughput([0.0, 1.0, 2.0], [4.0, None, 5.0]) == pytest.approx(2 / 5)
    assert stats.throughput([], [1.0]) is None
    assert stats.throughput([1.0], [1.0]) is None


def test_stages_and_ungate():
    t = gang(0.0, [5.0, 6.0], quota_reserved=0.5, check_ready=0.8, admitted=0.9)
    s = t.stages()
    assert s["create→quota reserved"] == 0.5
    assert s["quota reserved→check Ready"] == pytest.approx(0.3)
    assert s["check Ready→admitted"] == pytest.approx(0.1)
    assert "admitted→Job unsuspended" not in s  # the Job was not seen
    assert s["first→all pods created"] == 0.0
    assert s["all pods created→all ungated"] == 2.0  # last gate gone at 3, pods seen at 1
    assert s["all bound→all Running"] == 2.0
    assert sorted(stats.ungate_latencies([t])) == [1.0, 2.0]
    plain = gang(0.0, [5.0], quota_reserved=0.5, admitted=0.5)
    assert "quota reserved→admitted" in plain.stages()
    t.pod_created["p1"] = 1.5  # the Job controller's second batch
    assert t.stages()["first→all pods created"] == 0.5
    assert t.timeline(-1.0) == {
        "created": 1.0,
        "workload_seen": None,
        "quota_reserved": 1.5,
        "check_ready": 1.8,
        "admitted": 1.9,
        "unsuspended": None,
        "first_pod_created": 2.0,
        "all_pods_created": 2.5,
        "all_running": 7.0,
    }
    summary = stats.stage_summary([t, plain])
    assert summary["create→quota reserved"]["n"] == 2


def test_cpu_by_process_leaves_out_what_did_not_run_throughout() -> None:
    got = stats.cpu_by_process(
        {"kube-apiserver": 10.0, "nexus-admit": None, "kueue": 3.0},
        {"kube-apiserver": 40.0, "nexus-admit": 9.0, "kueue": 3.5, "etcd": 2.0},
        wall_s=60,
    )
    assert got == {
        "kube-apiserver": {"cpu_s": 30.0, "core_percent": 50.0},
        "kueue": {"cpu_s": 0.5, "core_percent": 0.8},
    }


def test_counter_delta_sums_per_label_and_drops_what_did_not_move() -> None:
    before = (
        'apiserver_request_total{verb="PATCH",resource="pods",code="200"} 5\n'
        'apiserver_request_total{verb="GET",resource="jobs",code="200"} 7\n'
    )
    after = (
        'apiserver_request_total{verb="PATCH",resource="pods",code="200"} 9\n'
        'apiserver_request_total{verb="PATCH",resource="pods",code="409"} 2\n'
        'apiserver_request_total{verb="GET",resource="jobs",code="200"} 7\n'
    )
    got = stats.counter_delta(after, before, "apiserver_request_total", ("verb", "resource"))
    assert got == {("PATCH", "pods"): 6.0}


def test_cpu_per_workload_divides_by_admitted_and_totals_without_the_bench() -> None:
    cpu = {
        "kube-apiserver": {"cpu_s": 30.0, "core_percent": 50.0},
        "nexus-admit": {"cpu_s": 6.0, "core_percent": 10.0},
        "bench": {"cpu_s": 12.0, "core_percent": 20.0},
    }
    got = stats.cpu_per_workload(cpu, admitted=60, leave_out="bench")
    assert got == {
        "kube-apiserver": 0.5,
        "nexus-admit": 0.1,
        "bench": 0.2,
        stats.ALL_BUT_BENCH: 0.6,
    }
    assert stats.cpu_per_workload(cpu, admitted=0, leave_out="bench") == {}


def test_cpu_per_workload_beyond_idle_takes_off_each_idle_rate_over_the_phase() -> None:
    cpu = {
        "kube-apiserver": {"cpu_s": 30.0, "core_percent": 50.0},
        "kwok": {"cpu_s": 1.0, "core_percent": 1.7},
        "bench": {"cpu_s": 12.0, "core_percent": 20.0},
        "nexus-admit": {"cpu_s": 6.0, "core_percent": 10.0},  # no idle reading: left out
    }
    idle = {
        "kube-apiserver": {"cpu_s": 2.0, "core_percent": 10.0},
        "kwok": {"cpu_s": 0.6, "core_percent": 3.0},
        "bench": {"cpu_s": 0.0, "core_percent": 0.0},
    }
    got = stats.cpu_per_workload_beyond_idle(cpu, idle, wall_s=60.0, admitted=60, leave_out="bench")
    assert got == {
        "kube-apiserver": 0.4,  # (30 - 0.10 * 60) / 60
        "kwok": -0.0133,  # used less than its idle rate: noise, shown as it is
        "bench": 0.2,
        stats.ALL_BUT_BENCH: 0.3867,
    }
    assert stats.cpu_per_workload_beyond_idle(cpu, idle, 60.0, 0, "bench") == {}


def test_busy_percent_adds_every_process_but_the_bench() -> None:
    used = {
        "kube-apiserver": {"cpu_s": 3.0, "core_percent": 30.0},
        "kwok": {"cpu_s": 1.0, "core_percent": 10.0},
        "bench": {"cpu_s": 5.0, "core_percent": 50.0},
    }
    assert stats.busy_percent(used, "bench") == 40.0
    assert stats.busy_percent({}, "bench") == 0.0


def test_cpu_share_counts_a_process_absent_without_nexus_as_zero() -> None:
    without = {"kube-apiserver": 0.5, "etcd": 0.2, stats.ALL_BUT_BENCH: 0.7}
    with_ = {"kube-apiserver": 0.8, "nexus-admit": 0.3, stats.ALL_BUT_BENCH: 1.3}
    assert stats.cpu_share(without, with_) == {
        "kube-apiserver": pytest.approx(0.3),
        "nexus-admit": 0.3,
        stats.ALL_BUT_BENCH: pytest.approx(0.6),
        "etcd": None,  # not read with nexus: unknown, not zero
    }


def test_first_decision_is_the_earliest_check_ready_since_the_process_start() -> None:
    early = stats.WorkloadTimes(pods=1, created=110.0, check_ready=125.0)
    first_created = stats.WorkloadTimes(pods=1, created=105.0, check_ready=130.0)
    undecided = stats.WorkloadTimes(pods=1, created=104.0)
    got = stats.first_decision(100.0, 102.5, 112.0, [first_created, early, undecided])
    assert got == {
        "webhook_serving_s": 2.5,
        "store_synced_s": 12.0,
        "first_workload_created_s": 4.0,
        "first_check_ready_s": 25.0,
        "first_decision_after_its_create_s": 15.0,
    }
    nothing = stats.first_decision(100.0, None, None, [undecided])
    assert nothing["first_check_ready_s"] is None
    assert nothing["first_decision_after_its_create_s"] is None
    assert nothing["first_workload_created_s"] == 4.0


def test_lease_renewals_due_a_quarter_of_the_duration_after_the_last() -> None:
    # renewed at 0 and 200 with 900-s leases: due at 225 and 425; at 300 the first is late
    assert stats.lease_renewals_due([(0.0, 900.0), (200.0, 900.0)], now=300.0) == [-75.0, 125.0]


def test_lease_wait_until_the_next_round_is_far_enough() -> None:
    assert stats.lease_wait([200.0, 180.0], needed_s=150) is None  # quiet long enough
    assert stats.lease_wait([], needed_s=150) is None  # no leases at all
    assert stats.lease_wait([200.0, 20.0], needed_s=150) == 21.0  # sleep past its start
    assert stats.lease_wait([200.0, 100.0], needed_s=150) == 30.0  # looked at again by then
    assert stats.lease_wait([200.0, -3.0], needed_s=150) == 2.0  # a round under way


def test_kwok_plays_refused_as_out_of_date_are_counted_apart() -> None:
    def line(pod: str, err: str) -> str:
        return (f'{{"level":"ERROR","msg":"failed to apply stage","err":"{err}",'
                f'"pod":"{pod}","stage":"pod-ready"}}')
    log = "\n".join([
        line("bench-nexus/a", 'failed to patch pod a: Operation cannot be fulfilled on pods '
             '\\"a\\": the object has been modified; please apply your changes'),
        line("bench-nexus/b", 'failed to patch pod b: Pod \\"b\\" is invalid: status.podIPs'),
        line("bench-kueue/c", "failed to patch pod c: the object has been modified"),
        '{"level":"INFO","msg":"Patch pod","pod":"bench-nexus/a"}',
    ])
    assert stats.kwok_plays_failed(log, "bench-nexus") == {"failed": 1, "refused_replays": 1}
    assert stats.kwok_plays_failed("", "bench-nexus") == {"failed": 0, "refused_replays": 0}


def test_kwok_status_patches_are_counted_per_pod() -> None:
    log = "\n".join([
        '{"level":"INFO","msg":"Patch pod","pod":"replay/p1","subresource":"status"}',
        '{"level":"INFO","msg":"Patch pod","pod":"replay/p1","subresource":"status"}',
        '{"level":"INFO","msg":"Patch pod","pod":"replay/p2","subresource":"status"}',
        '{"level":"INFO","msg":"Patch pod","pod":"other/p1","subresource":"status"}',
        '{"level":"ERROR","msg":"failed to apply stage","pod":"replay/p3"}',
    ])
    assert stats.kwok_status_patches(log, "replay") == {"p1": 2, "p2": 1}
