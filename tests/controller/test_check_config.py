"""Which PlacementConfig an AdmissionCheck means, or why it cannot be active."""

from __future__ import annotations

import pytest

from nexus_admit.controller.check_config import active_condition, resolve_check
from nexus_admit.kube import labels as L


def check(params: object) -> dict[str, object]:
    spec: dict[str, object] = {"controllerName": L.ADMISSION_CHECK_CONTROLLER}
    if params is not None:
        spec["parameters"] = params
    return {"metadata": {"name": "nexus"}, "spec": spec}


def ref(name: str, kind: str = L.KIND_PLACEMENT_CONFIG) -> dict[str, str]:
    return {"apiGroup": L.API_GROUP, "kind": kind, "name": name}


CONFIGS = {
    "good": {
        "kind": "PlacementConfig",
        "metadata": {"name": "good"},
        "spec": {"defaultTier": "gold"},
    },
    "bad": {"kind": "PlacementConfig", "metadata": {"name": "bad"}, "spec": {"tiers": "x"}},
    "no-topo": {
        "kind": "PlacementConfig",
        "metadata": {"name": "no-topo"},
        "spec": {"topology": {"topologyName": "missing"}},
    },
}


@pytest.mark.parametrize(
    ("params", "active", "says"),
    [
        pytest.param(None, True, "", id="no-parameters-defaults"),
        pytest.param(ref("good"), True, "", id="valid-config"),
        pytest.param(ref("nope"), False, "does not exist", id="missing-config"),
        pytest.param(ref("bad"), False, "spec.tiers", id="invalid-config"),
        pytest.param(ref("no-topo"), False, "no Kueue Topology", id="unknown-topology"),
        pytest.param(
            ref("good", kind="ProvisioningRequestConfig"), False, "must name", id="wrong-kind"
        ),
    ],
)
def test_resolve_check(params, active, says) -> None:
    view = resolve_check(check(params), CONFIGS, {})
    cond = active_condition(view)
    assert (cond["status"] == "True") is active
    assert says in cond["message"]


def test_the_config_is_the_same_object_from_pass_to_pass_until_it_changes() -> None:
    """The engine keeps per-snapshot caches keyed on the PlacementConfig object: a new
    object per pass rebuilt them on every decision. A changed PlacementConfig (a new
    resourceVersion) is read again."""
    import asyncio
    import copy

    from nexus_admit.controller.check_config import sync_checks
    from nexus_admit.controller.context import Context
    from nexus_admit.controller.options import RunOptions
    from nexus_admit.placement.policies import make_policy
    from tests.controller.fake_api import FakeApi

    api = FakeApi()
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=make_policy("nexus"))  # type: ignore[arg-type]
    good = copy.deepcopy(CONFIGS["good"])
    good["metadata"]["resourceVersion"] = "1"
    ac = {"kind": "AdmissionCheck", **check(ref("good"))}
    ctx.store.replace(L.KIND_PLACEMENT_CONFIG, [good], 1)
    ctx.store.replace("AdmissionCheck", [ac], 1)
    asyncio.run(sync_checks(ctx))
    first = ctx.checks["nexus"].config
    asyncio.run(sync_checks(ctx))
    assert first is not None and ctx.checks["nexus"].config is first
    changed = copy.deepcopy(good)
    changed["metadata"]["resourceVersion"] = "2"
    changed["spec"]["defaultTier"] = "silver"
    ctx.store.replace(L.KIND_PLACEMENT_CONFIG, [changed], 2)
    asyncio.run(sync_checks(ctx))
    again = ctx.checks["nexus"].config
    assert again is not first and again is not None and again.default_tier == "silver"


def test_a_check_on_a_multikueue_managers_cluster_queue_is_inactive_saying_where_it_belongs(
) -> None:
    """A manager dispatches to workers and has no GPU nodes: the check is refused once,
    on the AdmissionCheck (Kueue then marks the ClusterQueue inactive), not per Workload.
    A worker's ClusterQueue (ours alone) keeps it active; a malformed ClusterQueue lists
    nothing."""
    import asyncio

    from nexus_admit.controller.check_config import sync_checks
    from nexus_admit.controller.context import Context
    from nexus_admit.controller.options import RunOptions
    from nexus_admit.kube.queues import MULTIKUEUE_CONTROLLER
    from nexus_admit.placement.policies import make_policy
    from tests.controller.fake_api import FakeApi

    def cq(name: str, *checks: str) -> dict[str, object]:
        return {"kind": "ClusterQueue", "metadata": {"name": name}, "spec": {
            "admissionChecksStrategy": {"admissionChecks": [{"name": c} for c in checks]}}}

    on_worker = {"kind": "AdmissionCheck", **check(None)}
    on_manager = {"kind": "AdmissionCheck", "metadata": {"name": "nexus-mgr"},
                  "spec": {"controllerName": L.ADMISSION_CHECK_CONTROLLER}}
    multikueue = {"kind": "AdmissionCheck", "metadata": {"name": "mk"},
                  "spec": {"controllerName": MULTIKUEUE_CONTROLLER}}
    api = FakeApi()
    ctx = Context(options=RunOptions(webhook=False), api=api, engine=make_policy("nexus"))  # type: ignore[arg-type]
    ctx.store.replace("AdmissionCheck", [on_worker, on_manager, multikueue], 1)
    ctx.store.replace("ClusterQueue", [
        cq("workers", "nexus"), cq("manager", "mk", "nexus-mgr"),
        {"kind": "ClusterQueue", "metadata": {"name": "broken"}, "spec": "nope"}], 1)
    asyncio.run(sync_checks(ctx))
    assert ctx.checks["nexus"].config is not None
    view = ctx.checks["nexus-mgr"]
    cond = active_condition(view)
    assert view.config is None and cond["status"] == "False"
    assert cond["reason"] == "MultiKueueManager"
    assert "ClusterQueue manager" in cond["message"]
    assert "worker clusters' ClusterQueues" in cond["message"]
