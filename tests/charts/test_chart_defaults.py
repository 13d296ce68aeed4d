"""`helm template` with nothing but the chart, as CD tools and `helm template | kubectl
apply` render it: no --kube-version, no --api-versions."""

from __future__ import annotations

from typing import Any

import yaml

from tests.charts.helm import CHART, POLICY_API, by_kind, helm


def _objects(*args: str) -> list[dict[str, Any]]:
    r = helm("template", "nexus-admit", str(CHART), "--namespace", "nexus-system", *args)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def test_renders_without_kube_version_in_webhook_gate_mode() -> None:
    # helm's own Kubernetes (a release's: its client-go's minor, 1.37 for v3.22.0) meets
    # the chart's kubeVersion; without the cluster's API list the gate stays the webhook's
    objects = _objects()
    assert by_kind(objects, "Deployment")
    assert by_kind(objects, "MutatingWebhookConfiguration")
    assert not by_kind(objects, "MutatingAdmissionPolicy")


def test_the_policy_api_passed_alone_turns_on_the_gate_policy() -> None:
    objects = _objects("--api-versions", POLICY_API)
    assert by_kind(objects, "MutatingAdmissionPolicy")
