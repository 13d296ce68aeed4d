"""Pod topologySpreadConstraints and required pod (anti-)affinity → hard spread rules, or
a TranslationError naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_admit.kube.errors import TranslationError
from nexus_admit.kube.podspread import selects, spread_rules
from nexus_admit.model import SpreadRule

HOST = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
LEVELS = (ZONE, HOST)
WL: dict[str, Any] = {"kind": "Workload", "metadata": {"name": "w", "namespace": "ns"}}
OWN = {"app": "web"}
FIELD = "spec.podSets[0].template.spec"


def _rules(spec: dict[str, Any], labels: dict[str, str] | None = OWN) -> list[SpreadRule]:
    return spread_rules(WL, spec, FIELD, labels, LEVELS)


def _spread(key: str, skew: int = 1, when: str | None = None, **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"maxSkew": skew, "topologyKey": key,
                         "labelSelector": {"matchLabels": OWN}, **extra}
    if when:
        c["whenUnsatisfiable"] = when
    return {"topologySpreadConstraints": [c]}


def _anti(key: str, selector: dict[str, Any] | None = None) -> dict[str, Any]:
    term = {"topologyKey": key, "labelSelector": selector or {"matchLabels": OWN}}
    return {"affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


def test_do_not_schedule_on_a_level_is_a_skew_rule() -> None:
    assert _rules(_spread(ZONE, 2)) == [SpreadRule(ZONE, max_skew=2)]
    assert _rules(_spread(HOST, 1, "DoNotSchedule")) == [SpreadRule(HOST, max_skew=1)]


def test_schedule_anyway_is_soft_and_not_read() -> None:
    assert _rules(_spread("example.com/row", 1, "ScheduleAnyway")) == []


def test_required_anti_affinity_on_own_pods_is_one_per_domain() -> None:
    assert _rules(_anti(HOST)) == [SpreadRule(HOST, max_per_domain=1)]
    assert _rules(_anti(ZONE)) == [SpreadRule(ZONE, max_per_domain=1)]
    preferred = {"affinity": {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}}}
    assert _rules(preferred) == []


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        (_spread("example.com/row"), "topologySpreadConstraints[0].topologyKey",
         "not a topology level"),
        (_spread(ZONE, labelSelector={"matchLabels": {"app": "db"}}),
         "topologySpreadConstraints[0].labelSelector", "other pods"),
        (_spread(ZONE, minDomains=2), "topologySpreadConstraints[0].minDomains", "minDomains"),
        (_spread(ZONE, 0), "topologySpreadConstraints[0].maxSkew", "at least 1"),
        (_anti("example.com/row"),
         "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
         ".topologyKey", "not a topology level"),
        (_anti(HOST, {"matchLabels": {"app": "db"}}),
         "affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
         ".labelSelector", "other pods"),
        ({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": HOST}]}}},
         "affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution",
         "not honoured"),
    ],
)
def test_what_cannot_be_honoured_is_refused_with_the_field(
    spec: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(TranslationError) as err:
        _rules(spec)
    assert err.value.field == f"{FIELD}.{field}"
    assert words in err.value.message


def test_unknown_labels_are_taken_as_own_and_no_selector_selects_nothing() -> None:
    assert _rules(_spread(ZONE, labelSelector={"matchLabels": {"x": "y"}}), None) == [
        SpreadRule(ZONE, max_skew=1)
    ]
    no_selector = {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": ZONE}]}
    assert _rules(no_selector) == []


@pytest.mark.parametrize(
    ("expr", "matched"),
    [
        ({"key": "app", "operator": "In", "values": ["web", "api"]}, True),
        ({"key": "app", "operator": "NotIn", "values": ["web"]}, False),
        ({"key": "tier", "operator": "Exists"}, False),
        ({"key": "tier", "operator": "DoesNotExist"}, True),
    ],
)
def test_label_selector_expressions(expr: dict[str, Any], matched: bool) -> None:
    assert selects(WL, {"matchExpressions": [expr]}, OWN, "sel") is matched


def test_a_bad_selector_operator_names_its_field() -> None:
    with pytest.raises(TranslationError) as err:
        selects(WL, {"matchExpressions": [{"key": "a", "operator": "Gt"}]}, OWN, "sel")
    assert err.value.field == "sel.matchExpressions[0].operator"


JOB_WL: dict[str, Any] = {"kind": "Workload", "metadata": {
    "name": "job-train-1a2b3", "namespace": "ns", "ownerReferences": [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u-1",
         "controller": True}]}}


@pytest.mark.parametrize("selector", [
    {"matchLabels": {"job-name": "train"}},
    {"matchLabels": {"batch.kubernetes.io/job-name": "train"}},
    {"matchLabels": {"controller-uid": "u-1"}},
    {"matchExpressions": [{"key": "batch.kubernetes.io/controller-uid", "operator": "In",
                           "values": ["u-1"]}]},
], ids=["job-name", "batch-job-name", "controller-uid", "batch-controller-uid-in"])
def test_a_selector_of_the_labels_the_job_controller_adds_is_the_gangs_own(
    selector: dict[str, Any],
) -> None:
    """Kueue's Workload template lacks the labels the Job controller puts on the pods."""
    spread = {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": HOST, "labelSelector": selector}]}
    assert spread_rules(JOB_WL, spread, FIELD, OWN, LEVELS) == [SpreadRule(HOST, max_skew=1)]
    anti = _anti(HOST, selector)
    assert spread_rules(JOB_WL, anti, FIELD, OWN, LEVELS) == [
        SpreadRule(HOST, max_per_domain=1)]


def test_a_selector_of_another_jobs_pods_is_still_refused() -> None:
    other = {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": HOST, "labelSelector": {"matchLabels": {
            "job-name": "someone-else"}}}]}
    with pytest.raises(TranslationError, match="other pods"):
        spread_rules(JOB_WL, other, FIELD, OWN, LEVELS)
    with pytest.raises(TranslationError, match="other pods"):  # no Job owns the Workload
        spread_rules(WL, {"topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": HOST,
             "labelSelector": {"matchLabels": {"job-name": "train"}}}]}, FIELD, OWN, LEVELS)
