"""Which PlacementConfig an AdmissionCheck means, or why it cannot be active."""

from __future__ import annotations

import pytest

from nexus_admit.controller.admissioncheck import active_condition, resolve_check
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
