"""The helm chart, rendered by the real helm binary (no cluster): lint, the objects each set
of values produces, the values schema, and the chart's copies of the CRDs.

What the apiserver makes of these renders is e2e/tests/test_chart.py's job.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from nexus_admit import __version__
from nexus_admit.kube.pod_gate_policy import (
    pod_gate_binding,
    pod_gate_policy,
    queue_gate_binding,
    queue_gate_policy,
    untrusted_creator_condition,
)
from nexus_admit.model import PlacementConfig
from tests.charts.helm import (
    CHART,
    POLICY_API,
    ROOT,
    SCHEMA,
    by_kind,
    helm,
    placement_spec_schema,
    render,
    template,
)

NS = "nexus-system"
FULLNAME = "nexus-admit"  # release "nexus-admit": the release name is the full name

NON_DEFAULT: dict[str, Any] = {
    "fullnameOverride": "gpu-placer",
    "image": {"repository": "registry.example/nexus-admit", "tag": "9.9.9"},
    "controller": {"policy": "nexus", "logLevel": "DEBUG", "retrySeconds": 7, "dryRun": True},
    "serviceAccount": {"name": "placer"},
    "webhook": {"timeoutSeconds": 3, "excludedNamespaces": ["kube-system", "infra"]},
    "certManager": {"enabled": True},
    "admissionCheck": {"name": "gpu-placement"},
    "placementConfig": {
        "name": "fleet",
        "spec": {
            "topology": {"topologyName": "gpu-fabric"},
            "hardwareClasses": [
                {"name": "fast", "gpuProducts": ["NVIDIA-H100*"]},
                {"name": "rest", "gpuProducts": ["*"]},
            ],
            "tiers": [
                {"name": "prod", "classCosts": {"fast": 0, "rest": 50}},
                {"name": "dev", "classCosts": {"fast": 60, "rest": 0}},
            ],
            "defaultTier": "dev",
            "solver": {"timeLimitSeconds": 2.5},
        },
    },
    "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
    "podDisruptionBudget": {"enabled": True, "minAvailable": "50%"},
    "replicaCount": 3,
    "leaderElection": {"leaseSeconds": 30, "renewDeadlineSeconds": 20, "retrySeconds": 4},
    "affinity": {"nodeAffinity": {}},
    "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
}


@pytest.fixture(scope="module")
def default_objects() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def custom_objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(NON_DEFAULT, tmp=tmp_path_factory.mktemp("values"))


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects rendered"
    return dict(found[0])


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(c)


# ---- lint and the CRDs -------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, NON_DEFAULT], ids=["default", "non-default"])
def test_helm_lint_strict_passes(values: dict[str, Any] | None, tmp_path: Path) -> None:
    args = ["lint", "--strict", str(CHART), "--kube-version", "1.36.0"]
    if values:
        f = tmp_path / "values.yaml"
        f.write_text(yaml.safe_dump(values))
        args += ["--values", str(f)]
    r = helm(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 chart(s) failed" in r.stdout


@pytest.mark.parametrize(("version", "installs"), [("1.33.9", False), ("1.34.0", True)])
def test_the_chart_refuses_a_kubernetes_older_than_the_oldest_tested(
    version: str, installs: bool
) -> None:
    # 1.34 is the oldest plane make test runs (e2e/versions.env KUBERNETES_OLDEST_VERSION)
    r = helm("template", "x", str(CHART), "--kube-version", version)
    assert (r.returncode == 0) is installs, r.stderr
    if not installs:
        assert "kubeVersion" in r.stderr and ">=1.34.0-0" in r.stderr, r.stderr


def test_the_chart_crds_are_the_repository_crds_byte_for_byte() -> None:
    repo = {p.name: p.read_bytes() for p in sorted((ROOT / "crds").glob("*.yaml"))}
    chart = {p.name: p.read_bytes() for p in sorted((CHART / "crds").glob("*.yaml"))}
    assert set(chart) == set(repo), "cp crds/*.yaml charts/nexus-admit/crds/"
    for name in repo:
        assert chart[name] == repo[name], f"charts/nexus-admit/crds/{name} differs from crds/"


def test_values_schema_placement_spec_is_current() -> None:
    schema = json.loads(SCHEMA.read_text())
    embedded = schema["properties"]["placementConfig"]["properties"]["spec"]
    assert embedded == placement_spec_schema(), "run: python -m tests.charts.helm"


def test_default_values_placement_config_is_valid_for_the_model() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    PlacementConfig.model_validate(values["placementConfig"]["spec"])
    PlacementConfig.model_validate(NON_DEFAULT["placementConfig"]["spec"])


# ---- the values schema ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("set_flag", "message"),
    [
        ("webhok.enabled=false", "additional properties 'webhok' not allowed"),
        ("webhook.timeoutSecond=3", "at '/webhook': additional properties 'timeoutSecond'"),
        (
            "placementConfig.spec.weights.tierMismach=3",
            "at '/placementConfig/spec/weights': additional properties 'tierMismach'",
        ),
        ("placementConfig.spec.tiers[0].nam=x", "at '/placementConfig/spec/tiers/0'"),
        ("replicaCount=0", "at '/replicaCount': minimum"),
        ("webhook.failurePolicy=Maybe", "at '/webhook/failurePolicy'"),
        ("controller.logLevel=LOUD", "at '/controller/logLevel'"),
    ],
    ids=["top-level", "nested", "placement-weights", "placement-tier", "replicas", "enum", "level"],
)
def test_schema_rejects_a_typo_with_the_path(set_flag: str, message: str) -> None:
    r = helm("template", "x", str(CHART), "--kube-version", "1.36.0", "--set", set_flag)
    assert r.returncode != 0
    assert "don't meet the specifications of the schema" in r.stderr
    assert message in r.stderr, r.stderr


def test_schema_forbids_unknown_keys_at_every_object_level() -> None:
    """Every object in the schema either lists its properties with additionalProperties false,
    or is a map of one value type, or is a free-form Kubernetes field named as such."""
    free_form = {"affinity", "namespaceSelector", "queuedPodNamespaceSelector", "podSelector",
                 "tolerations", "extraEnv"}

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") == "object" or "properties" in node:
            if "properties" in node:
                assert node.get("additionalProperties") is False, path
            elif path.rsplit(".", 1)[-1].removesuffix("[]") not in free_form:
                assert isinstance(node.get("additionalProperties"), dict), path
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key], f"{path}[]")

    walk(json.loads(SCHEMA.read_text()), "values")


# ---- the default render ----------------------------------------------------------------------


def test_default_render_has_exactly_the_expected_objects(
    default_objects: list[dict[str, Any]],
) -> None:
    kinds = sorted(o["kind"] for o in default_objects)
    assert kinds == sorted(
        [
            "AdmissionCheck",
            "ClusterRole",
            "ClusterRole",  # <fullname>-metrics-reader, for the scraper
            "ClusterRoleBinding",
            "Deployment",
            "MutatingWebhookConfiguration",
            "NetworkPolicy",
            "PlacementConfig",
            "PodDisruptionBudget",
            "Role",
            "RoleBinding",
            "Secret",
            "Service",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
        ]
    )
    for o in default_objects:
        if o["kind"] not in {"ClusterRole", "ClusterRoleBinding", "AdmissionCheck"} | {
            "MutatingWebhookConfiguration",
            "PlacementConfig",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        }:
            assert o["metadata"]["namespace"] == NS, o["kind"]


def test_deployment_runs_the_controller_with_restricted_pod_security(
    default_objects: list[dict[str, Any]],
) -> None:
    deploy = one(default_objects, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    c = container(default_objects)
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert c["image"] == f"nexus-admit:{__version__}"
    assert c["args"][0] == "run"
    assert "--webhook-cert=/etc/nexus-admit/webhook/tls.crt" in c["args"]
    assert "--webhook-key=/etc/nexus-admit/webhook/tls.key" in c["args"]
    assert "--health-port=8080" in c["args"]
    assert {
        "--leader-elect",
        f"--lease-name={FULLNAME}",
        "--lease-seconds=15",
        "--renew-deadline-seconds=10",
        "--lease-retry-seconds=2",
    } <= set(c["args"])
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    assert env["NEXUS_NAMESPACE"] == "metadata.namespace"
    assert env["NEXUS_LEADER_IDENTITY"] == "metadata.name"
    values = {e["name"]: e.get("value") for e in c["env"]}
    assert values["MALLOC_ARENA_MAX"] == "2"
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == (deploy["spec"]["selector"]["matchLabels"])
    )
    assert one(default_objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"health": 8080, "webhook": 9443}
    assert c["resources"]["requests"] == {"cpu": "500m", "memory": "512Mi"}
    assert c["securityContext"] == {
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["serviceAccountName"] == FULLNAME
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == {"tmp": "/tmp", "webhook-cert": "/etc/nexus-admit/webhook"}
    (secret,) = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert secret == one(default_objects, "Secret")["metadata"]["name"]


def test_every_rendered_flag_is_a_flag_of_nexus_admit_run(
    default_objects: list[dict[str, Any]], custom_objects: list[dict[str, Any]]
) -> None:
    help_text = subprocess.run(
        [sys.executable, "-m", "nexus_admit.cli", "run", "--help"],
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin", "TERM": "dumb"},
        check=True,
    ).stdout
    for objects in (default_objects, custom_objects):
        for arg in container(objects)["args"][1:]:
            flag = arg.split("=", 1)[0]
            assert flag in help_text, f"{flag} is not an option of `nexus-admit run`"


def test_rbac_is_exactly_what_the_controller_calls(default_objects: list[dict[str, Any]]) -> None:
    (role,) = [
        r for r in by_kind(default_objects, "ClusterRole") if r["metadata"]["name"] == FULLNAME
    ]
    rules = role["rules"]
    granted = {
        (group, resource, verb)
        for r in rules
        for group in r["apiGroups"]
        for resource in r["resources"]
        for verb in r["verbs"]
    }
    read = {"get", "list", "watch"}
    expected = {("", "nodes", v) for v in read} | {("", "pods", v) for v in read | {"patch"}}
    expected |= {("batch", "jobs", "get")}  # read on demand (controller/owning_jobs.py)
    # owners between a pod and its Workload's owner (controller/pod_owners.py)
    expected |= {("apps", "replicasets", "get"), ("jobset.x-k8s.io", "jobsets", "get")}
    expected |= {("ray.io", "rayclusters", "get")}
    expected |= {("apps", "statefulsets", v) for v in read}  # their queue label
    for kind in ("workloads", "localqueues", "clusterqueues", "resourceflavors", "topologies"):
        expected |= {("kueue.x-k8s.io", kind, v) for v in read}
    expected |= {("kueue.x-k8s.io", "admissionchecks", v) for v in read}
    expected |= {("kueue.x-k8s.io", "workloads/status", "patch")}
    # the reservation's ownerReference sets blockOwnerDeletion: OwnerReferencesPermission-
    # Enforcement refuses every create without update on the owner's finalizers
    expected |= {("kueue.x-k8s.io", "workloads/finalizers", "update")}
    expected |= {("kueue.x-k8s.io", "admissionchecks/status", "patch")}
    expected |= {("topology.node.k8s.io", "noderesourcetopologies", v) for v in read}
    expected |= {("node.k8s.io", "runtimeclasses", v) for v in read}  # pod overhead
    expected |= {("", "limitranges", v) for v in read}  # container default requests
    for kind in ("resourceslices", "resourceclaims", "resourceclaimtemplates", "devicetaintrules"):
        expected |= {("resource.k8s.io", kind, v) for v in read}
    expected |= {("scheduling.kubenexus.io", "placementconfigs", v) for v in read}
    expected |= {
        ("scheduling.kubenexus.io", "resourcereservations", v)
        for v in read | {"create", "patch", "delete"}
    }
    expected |= {("scheduling.kubenexus.io", "resourcereservations/status", "patch")}
    expected |= {("events.k8s.io", "events", "create")}
    # /metrics behind authentication and authorisation (metrics.auth: kubernetes)
    expected |= {("authentication.k8s.io", "tokenreviews", "create")}
    expected |= {("authorization.k8s.io", "subjectaccessreviews", "create")}
    # no CRD rule: a kind not served at start-up is listed again until it is (informer.py)
    assert granted == expected
    assert not [g for g in granted if "*" in g or g[1] == "secrets"]
    binding = one(default_objects, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NS}]
    # leader election (controller/runtime/lease.py: get, create, update of one Lease), in the
    # release namespace only
    role = one(default_objects, "Role")
    assert role["metadata"]["namespace"] == NS
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]
    role_binding = one(default_objects, "RoleBinding")
    assert role_binding["roleRef"]["name"] == role["metadata"]["name"]
    assert role_binding["subjects"] == binding["subjects"]


def test_one_replica_gets_no_disruption_budget_that_would_block_every_drain(
    tmp_path: Path,
) -> None:
    objects = render({"replicaCount": 1}, tmp=tmp_path)
    assert not by_kind(objects, "PodDisruptionBudget")
    assert "--leader-elect" in container(objects)["args"], "a rolling update runs two at once"


def test_lease_timings_that_cannot_work_fail_the_render(tmp_path: Path) -> None:
    bad = {"leaderElection": {"leaseSeconds": 10, "renewDeadlineSeconds": 10, "retrySeconds": 2}}
    r = template(bad, tmp=tmp_path)
    assert r.returncode != 0
    assert "retrySeconds < renewDeadlineSeconds < leaseSeconds" in r.stderr


def test_pods_are_pinned_at_creation_by_default(tmp_path: Path) -> None:
    objects = render(api_versions=[POLICY_API], tmp=tmp_path)
    hooks = [h["name"] for h in one(objects, "MutatingWebhookConfiguration")["webhooks"]]
    assert hooks == ["pod-gate.scheduling.kubenexus.io", "pod-pin.scheduling.kubenexus.io"]
    policy = next(p for p in by_kind(objects, "MutatingAdmissionPolicy")
                  if p["metadata"]["name"].endswith("-pod-gate"))
    assert policy["spec"]["reinvocationPolicy"] == "Never"


def harness_webhooks(tmp_path: Path, gate_mode: str, pin: bool = False) -> list[dict[str, Any]]:
    """The webhooks e2e/nexus_controller.py registers by URL on the local control plane."""
    sys.path.insert(0, str(ROOT / "e2e"))
    try:
        from nexus_controller import NexusController  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(ROOT / "e2e"))
    (tmp_path / "ca.crt").write_text("x")
    stub = SimpleNamespace(
        cluster=SimpleNamespace(pki=tmp_path),
        webhook_port=1,
        webhook_config_name="harness",
        gate_mode=gate_mode,
        pin_at_creation=pin,
    )
    hooks: list[dict[str, Any]] = NexusController.webhook_configuration(stub)["webhooks"]
    return hooks


@pytest.mark.parametrize(
    ("api_versions", "gate_mode", "pin"),
    [
        # a 1.36 cluster: `auto` picks the policies; webhook.pinAtCreation (the default)
        # adds the pin hook
        ([POLICY_API], "policy", False),
        ([POLICY_API], "policy", True),
        # before 1.36: `auto` picks the webhook (e2e/tests/test_gate_webhook.py); with
        # pinAtCreation its reservation hook answers at /pod-gate-pin (no hook added)
        ([], "webhook", False),
        ([], "webhook", True),
    ],
    ids=["policy", "policy-pin", "webhook", "webhook-pin"],
)
def test_webhooks_are_the_harness_webhooks_behind_a_service(
    api_versions: list[str], gate_mode: str, pin: bool, tmp_path: Path
) -> None:
    values = {"webhook": {"pinAtCreation": pin}}
    objects = render(values, api_versions=api_versions, tmp=tmp_path)
    mwc = one(objects, "MutatingWebhookConfiguration")
    secret = one(objects, "Secret")
    service = one(objects, "Service")
    expected = harness_webhooks(tmp_path, gate_mode, pin)
    assert [h["name"] for h in mwc["webhooks"]] == [h["name"] for h in expected]
    for hook, want in zip(mwc["webhooks"], expected, strict=True):
        skip = {"clientConfig", "namespaceSelector"}
        assert {k: v for k, v in hook.items() if k not in skip} == {
            k: v for k, v in want.items() if k not in skip
        }
        pins = hook["name"].startswith("pod-pin.")
        gate_pins = pin and gate_mode == "webhook" and hook["name"].startswith("pod-gate.")
        # the pin hook never refuses a pod: without it the policy's gate stays
        assert hook["failurePolicy"] == ("Ignore" if pins else "Fail")
        assert hook["timeoutSeconds"] == 5
        # a hook that pins is never called twice for one pod
        assert hook["reinvocationPolicy"] == ("Never" if pins or gate_pins else "IfNeeded")
        assert hook["clientConfig"]["service"] == {
            "name": service["metadata"]["name"],
            "namespace": NS,
            "path": "/pod-pin" if pins else "/pod-gate-pin" if gate_pins else "/pod-gate",
            "port": 443,
        }
        assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
        (expr,) = hook["namespaceSelector"]["matchExpressions"]
        assert expr["operator"] == "NotIn"
        assert expr["values"] == ["kube-system", "kueue-system", NS]
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {"webhook": (443, "webhook"), "metrics": (8080, "health")}


@pytest.mark.parametrize("pin", [False, True], ids=["gate", "pin-at-creation"])
def test_gate_policies_are_the_controllers_own_and_see_the_webhooks_namespaces(
    pin: bool, tmp_path: Path
) -> None:
    objects = render(
        {"webhook": {"pinAtCreation": pin}}, api_versions=[POLICY_API], tmp=tmp_path
    )
    policies = {o["metadata"]["name"]: o for o in by_kind(objects, "MutatingAdmissionPolicy")}
    bindings = {
        o["metadata"]["name"]: o for o in by_kind(objects, "MutatingAdmissionPolicyBinding")
    }
    assert set(policies) == set(bindings) == {f"{FULLNAME}-pod-gate", f"{FULLNAME}-queue-gate"}
    webhook_namespaces = one(objects, "MutatingWebhookConfiguration")["webhooks"][0][
        "namespaceSelector"
    ]
    name = f"{FULLNAME}-pod-gate"
    assert policies[name]["spec"] == pod_gate_policy(name, pin_at_creation=pin)["spec"]
    # reinvoked after the pin hook, the policy would put back the gate the hook took off
    assert policies[name]["spec"]["reinvocationPolicy"] == ("Never" if pin else "IfNeeded")
    assert bindings[name]["spec"] == pod_gate_binding(name, webhook_namespaces)["spec"]
    name = f"{FULLNAME}-queue-gate"
    configmap = one(objects, "ConfigMap")
    assert configmap["metadata"] == {
        **configmap["metadata"],
        "name": f"{FULLNAME}-gated-queues",
        "namespace": NS,
    }
    assert "data" not in configmap, "an upgrade must keep the queues the controller wrote"
    assert policies[name]["spec"] == queue_gate_policy(name)["spec"]
    assert (
        bindings[name]["spec"]
        == queue_gate_binding(name, webhook_namespaces, NS, f"{FULLNAME}-gated-queues")["spec"]
    )
    # a missing ConfigMap gates nobody and refuses nobody
    assert bindings[name]["spec"]["paramRef"]["parameterNotFoundAction"] == "Allow"
    # the controller keeps exactly that ConfigMap, and may write only it
    assert f"--queue-gate-configmap={NS}/{FULLNAME}-gated-queues" in container(objects)["args"]
    role = one(objects, "Role")
    assert {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": [f"{FULLNAME}-gated-queues"],
        "verbs": ["get", "patch"],
    } in role["rules"]


def test_the_queue_gate_matches_only_pods_of_queues_the_configmap_lists() -> None:
    """The policy's own rules (the apiserver evaluates them in e2e/tests/test_outage.py and
    test_kinds_placed.py): Kueue's queue label or its StatefulSet suspension selects, the
    ConfigMap key "<namespace>.<queue>" (or "<namespace>_StatefulSet_<name>") decides
    (listed with a ClusterQueue, or not yet known: gated; listed with "": not); a
    reservation label is the other policy's."""
    spec = queue_gate_policy("x")["spec"]
    exprs = spec["matchConstraints"]["objectSelector"]["matchExpressions"]
    assert exprs == [{"key": "scheduling.kubenexus.io/reservation", "operator": "DoesNotExist"}]
    conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    assert "'kueue.x-k8s.io/queue-name' in object.metadata.labels" in conditions["kueue-managed"]
    assert "'kueue.x-k8s.io/pod-suspending-parent'" in conditions["kueue-managed"]
    queue_condition = {"expression": conditions["queue-uses-the-check"]}
    assert "request.namespace + '.'" in queue_condition["expression"]
    assert "request.namespace + '_StatefulSet_' + r.name" in queue_condition["expression"]
    assert "in params.data" in queue_condition["expression"]
    assert "!= ''" in queue_condition["expression"]
    assert spec["failurePolicy"] == "Fail"


@pytest.mark.parametrize(
    ("gate_mode", "api_versions", "by_policy"),
    [
        ("auto", [], False),  # a cluster without the API: every labelled pod to the webhook
        ("auto", [POLICY_API], True),
        ("webhook", [POLICY_API], False),
        ("policy", [], True),
    ],
)
def test_gate_mode_picks_the_policy_or_the_webhook(
    gate_mode: str, api_versions: list[str], by_policy: bool, tmp_path: Path
) -> None:
    objects = render({"webhook": {"gateMode": gate_mode}}, tmp=tmp_path, api_versions=api_versions)
    hooks = {h["name"]: h for h in one(objects, "MutatingWebhookConfiguration")["webhooks"]}
    assert bool(by_kind(objects, "MutatingAdmissionPolicy")) == by_policy
    assert bool(by_kind(objects, "MutatingAdmissionPolicyBinding")) == by_policy
    conditions = hooks["pod-gate.scheduling.kubenexus.io"].get("matchConditions")
    assert conditions == ([untrusted_creator_condition()] if by_policy else None)
    # with the policies, queued pods are gated in the apiserver and never reach the webhook
    # (an outage of nexus-admit then cannot refuse a pod of a queue without the check)
    assert ("queued-pod-gate.scheduling.kubenexus.io" in hooks) == (not by_policy)
    # a StatefulSet's pods carry no queue label at creation: a hook of their own
    sts_hook = hooks.get("statefulset-pod-gate.scheduling.kubenexus.io")
    assert (sts_hook is not None) == (not by_policy)
    if sts_hook is not None:
        (cond,) = sts_hook["matchConditions"]
        assert "'kueue.x-k8s.io/pod-suspending-parent'" in cond["expression"]
    assert bool(by_kind(objects, "ConfigMap")) == by_policy
    flags = container(objects)["args"]
    assert any(f.startswith("--queue-gate-configmap=") for f in flags) == by_policy


def test_webhook_mode_sends_only_the_chosen_namespaces_queued_pods(tmp_path: Path) -> None:
    selector = {"matchLabels": {"kueue-gpu": "true"}}
    objects = render(
        {"webhook": {"gateMode": "webhook", "queuedPodNamespaceSelector": selector}},
        tmp=tmp_path,
    )
    hooks = {h["name"]: h for h in one(objects, "MutatingWebhookConfiguration")["webhooks"]}
    assert hooks["queued-pod-gate.scheduling.kubenexus.io"]["namespaceSelector"] == selector
    assert hooks["pod-gate.scheduling.kubenexus.io"]["namespaceSelector"] != selector


def test_creates_in_flight_and_list_pages_reach_the_controller(
    default_objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    assert {
        "--creates-in-flight=4", "--list-page-size=500", "--list-page-timeout=30"
    } <= set(container(default_objects)["args"])
    values = {"controller": {"createsInFlight": 1, "listPageSize": 0, "listPageTimeoutSeconds": 5}}
    args = set(container(render(values, tmp=tmp_path))["args"])
    assert {"--creates-in-flight=1", "--list-page-size=0", "--list-page-timeout=5"} <= args


def test_creates_in_flight_outside_what_the_controller_takes_fails_the_render(
    tmp_path: Path,
) -> None:
    for value in (0, 65):
        r = template({"controller": {"createsInFlight": value}}, tmp=tmp_path)
        assert r.returncode != 0 and "createsInFlight" in r.stderr, r.stderr


def test_degraded_mode_delay_reaches_the_controller(tmp_path: Path) -> None:
    objects = render({"leaderElection": {"degradedAfterSeconds": 90}}, tmp=tmp_path)
    assert "--degraded-after-seconds=90" in container(objects)["args"]


def test_trusted_pod_creators_reach_the_webhooks_condition(tmp_path: Path) -> None:
    users = ["system:serviceaccount:kube-system:job-controller", "system:serviceaccount:x:y"]
    objects = render({"webhook": {"gateMode": "policy", "trustedPodCreators": users}}, tmp=tmp_path)
    hook = one(objects, "MutatingWebhookConfiguration")["webhooks"][0]
    assert hook["matchConditions"] == [untrusted_creator_condition(users)]


def test_generated_certificate_serves_the_service_name_and_chains_to_the_ca_bundle(
    default_objects: list[dict[str, Any]],
) -> None:
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    data = one(default_objects, "Secret")["data"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(data["ca.crt"]))
    leaf = x509.load_pem_x509_certificate(base64.b64decode(data["tls.crt"]))
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{FULLNAME}.{NS}.svc" in sans.get_values_for_type(x509.DNSName)
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usages
    lifetime = leaf.not_valid_after_utc - leaf.not_valid_before_utc
    assert 3649 <= lifetime.days <= 3651
    assert b"PRIVATE KEY" in base64.b64decode(data["tls.key"])


def test_admission_check_references_the_default_placement_config(
    default_objects: list[dict[str, Any]],
) -> None:
    check = one(default_objects, "AdmissionCheck")
    config = one(default_objects, "PlacementConfig")
    assert check["metadata"]["name"] == "nexus-placement"
    assert check["spec"] == {
        "controllerName": "kubenexus.io/placement",
        "parameters": {
            "apiGroup": "scheduling.kubenexus.io",
            "kind": "PlacementConfig",
            "name": config["metadata"]["name"],
        },
    }
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert config["spec"] == values["placementConfig"]["spec"]
    assert [t["name"] for t in config["spec"]["tiers"]] == ["gold", "silver", "bronze"]


# ---- non-default values -------------------------------------------------------------------------


def test_non_default_values_reach_the_objects(custom_objects: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in custom_objects)
    assert kinds.count("Certificate") == 2 and kinds.count("Issuer") == 2
    assert "Secret" not in kinds, "cert-manager writes the Secret"
    assert {"ServiceMonitor", "PodDisruptionBudget"} <= set(kinds)
    c = container(custom_objects)
    assert c["image"] == "registry.example/nexus-admit:9.9.9"
    assert {"--log-level=DEBUG", "--retry-seconds=7", "--dry-run"} <= set(c["args"])
    deploy = one(custom_objects, "Deployment")
    assert deploy["metadata"]["name"] == "gpu-placer"
    assert deploy["spec"]["template"]["spec"]["serviceAccountName"] == "placer"
    assert deploy["spec"]["template"]["spec"]["nodeSelector"] == {
        "node-role.kubernetes.io/control-plane": ""
    }
    check = one(custom_objects, "AdmissionCheck")
    assert check["metadata"]["name"] == "gpu-placement"
    assert check["spec"]["parameters"]["name"] == "fleet"
    config = one(custom_objects, "PlacementConfig")
    # helm merges maps with the defaults: the template drops the default levels
    assert config["spec"] == NON_DEFAULT["placementConfig"]["spec"]
    PlacementConfig.model_validate(config["spec"])
    assert one(custom_objects, "PodDisruptionBudget")["spec"]["minAvailable"] == "50%"
    assert deploy["spec"]["replicas"] == 3
    assert {"--lease-seconds=30", "--renew-deadline-seconds=20", "--lease-retry-seconds=4"} <= set(
        c["args"]
    )
    assert deploy["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": {}}
    monitor = one(custom_objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    mwc = one(custom_objects, "MutatingWebhookConfiguration")
    for hook in mwc["webhooks"]:
        assert hook["timeoutSeconds"] == 3
        assert "caBundle" not in hook["clientConfig"], "cainjector fills it"
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [
            "kube-system",
            "infra",
            NS,
        ]


def test_cert_manager_chain_feeds_the_mounted_secret_and_the_ca_injection(
    custom_objects: list[dict[str, Any]],
) -> None:
    certs = {c["metadata"]["name"]: c for c in by_kind(custom_objects, "Certificate")}
    issuers = {i["metadata"]["name"]: i for i in by_kind(custom_objects, "Issuer")}
    serving = certs["gpu-placer-webhook"]
    ca = certs["gpu-placer-ca"]
    assert ca["spec"]["isCA"] is True
    assert issuers[ca["spec"]["issuerRef"]["name"]]["spec"] == {"selfSigned": {}}
    ca_issuer = issuers[serving["spec"]["issuerRef"]["name"]]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    assert serving["spec"]["dnsNames"][0] == f"gpu-placer.{NS}.svc"
    mwc = one(custom_objects, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NS}/gpu-placer-webhook"
    )
    pod = one(custom_objects, "Deployment")["spec"]["template"]["spec"]
    (mounted,) = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert mounted == serving["spec"]["secretName"]


def test_webhook_disabled_renders_no_webhook_and_runs_without_it(tmp_path: Path) -> None:
    objects = render({"webhook": {"enabled": False}}, tmp=tmp_path)
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"MutatingWebhookConfiguration", "Secret", "Certificate", "Issuer"}
    c = container(objects)
    assert "--no-webhook" in c["args"]
    assert not [a for a in c["args"] if a.startswith("--webhook")]
    assert [p["name"] for p in one(objects, "Service")["spec"]["ports"]] == ["metrics"]


def test_crds_are_rendered_only_from_the_crds_directory() -> None:
    objects = render(include_crds=True)
    crds = sorted(o["metadata"]["name"] for o in by_kind(objects, "CustomResourceDefinition"))
    assert crds == [
        "placementconfigs.scheduling.kubenexus.io",
        "resourcereservations.scheduling.kubenexus.io",
    ]
    assert not by_kind(render(), "CustomResourceDefinition")


def test_an_existing_service_account_must_be_named(
    tmp_path: Path,
) -> None:
    r = template({"serviceAccount": {"create": False}}, tmp=tmp_path)
    assert r.returncode != 0
    assert "serviceAccount.name is required" in r.stderr


# ---- least privilege: the policies on the ServiceAccount's writes ---------------------------


def policies(objects: list[dict[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {o["metadata"]["name"]: o for o in by_kind(objects, "ValidatingAdmissionPolicy")}


def test_least_privilege_policies_bind_only_the_controllers_service_account(
    default_objects: list[dict[str, Any]], custom_objects: list[dict[str, Any]]
) -> None:
    for objects, sa, check, name in (
        (default_objects, f"system:serviceaccount:{NS}:{FULLNAME}", "nexus-placement", FULLNAME),
        (custom_objects, f"system:serviceaccount:{NS}:placer", "gpu-placement", "gpu-placer"),
    ):
        found = policies(objects)
        assert set(found) == {f"{name}-least-privilege-pods", f"{name}-least-privilege-checks"}
        for policy in found.values():
            spec = policy["spec"]
            assert spec["failurePolicy"] == "Fail"
            (cond,) = spec["matchConditions"]
            assert cond["expression"] == f"request.userInfo.username == '{sa}'"
            assert all(
                r["operations"] == ["UPDATE"] for r in spec["matchConstraints"]["resourceRules"]
            )
        pods = found[f"{name}-least-privilege-pods"]["spec"]
        assert pods["matchConstraints"]["resourceRules"][0]["resources"] == ["pods"]
        checks = found[f"{name}-least-privilege-checks"]["spec"]
        assert checks["matchConstraints"]["resourceRules"][0]["resources"] == [
            "workloads/status",
            "admissionchecks/status",
        ]
        ours = {v["name"]: v["expression"] for v in checks["variables"]}["ours"]
        assert ours == f"['{check}']"
        bindings = {
            b["spec"]["policyName"]: b for b in by_kind(objects, "ValidatingAdmissionPolicyBinding")
        }
        assert set(bindings) == set(found)
        assert all(b["spec"]["validationActions"] == ["Deny"] for b in bindings.values())
        assert all("matchResources" not in b["spec"] for b in bindings.values()), "every namespace"


def test_least_privilege_lists_every_check_it_is_given_and_can_be_turned_off(
    tmp_path: Path,
) -> None:
    objects = render({"leastPrivilege": {"admissionChecks": ["a", "b"]}}, tmp=tmp_path)
    (checks,) = [p for n, p in policies(objects).items() if n.endswith("-checks")]
    ours = {v["name"]: v["expression"] for v in checks["spec"]["variables"]}["ours"]
    assert ours == "['a', 'b']"
    off = render({"leastPrivilege": {"enabled": False}}, tmp=tmp_path)
    assert not by_kind(off, "ValidatingAdmissionPolicy")
    assert not by_kind(off, "ValidatingAdmissionPolicyBinding")


def test_least_privilege_rules_name_the_gate_and_prefix_the_controller_uses(
    default_objects: list[dict[str, Any]],
) -> None:
    from nexus_admit.kube import labels as L

    text = yaml.safe_dump(policies(default_objects))
    assert L.GATE_PLACEMENT in text
    assert f"'{L.ANN_SLOT.rsplit('/', 1)[0]}/'" in text  # scheduling.kubenexus.io/
    assert f"'{L.ADMISSION_CHECK_CONTROLLER}'" in text


# ---- a closed surface: /metrics and the NetworkPolicy ---------------------------------------


def test_metrics_need_a_token_the_apiserver_authorises_by_default(
    default_objects: list[dict[str, Any]],
) -> None:
    assert "--metrics-auth=kubernetes" in container(default_objects)["args"]
    (reader,) = [
        r
        for r in by_kind(default_objects, "ClusterRole")
        if r["metadata"]["name"] == f"{FULLNAME}-metrics-reader"
    ]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]


def test_open_metrics_drop_the_review_permissions_and_the_reader_role(tmp_path: Path) -> None:
    objects = render(
        {"metrics": {"auth": "none"}, "serviceMonitor": {"enabled": True}}, tmp=tmp_path
    )
    assert "--metrics-auth=none" in container(objects)["args"]
    roles = by_kind(objects, "ClusterRole")
    assert [r["metadata"]["name"] for r in roles] == [FULLNAME]
    granted = {res for r in roles[0]["rules"] for res in r["resources"]}
    assert not granted & {"tokenreviews", "subjectaccessreviews"}
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert "bearerTokenFile" not in endpoint


def test_service_monitor_scrapes_with_its_token_when_metrics_need_one(
    custom_objects: list[dict[str, Any]],
) -> None:
    (endpoint,) = one(custom_objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"


def test_metrics_over_tls_use_the_webhook_certificate_probes_and_scrapes_https(
    tmp_path: Path,
) -> None:
    objects = render({"metrics": {"tls": True}, "serviceMonitor": {"enabled": True}}, tmp=tmp_path)
    c = container(objects)
    assert {
        "--metrics-cert=/etc/nexus-admit/webhook/tls.crt",
        "--metrics-key=/etc/nexus-admit/webhook/tls.key",
    } <= set(c["args"])
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["scheme"] == "HTTPS", probe
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["serverName"] == f"{FULLNAME}.{NS}.svc"
    assert endpoint["tlsConfig"]["ca"]["secret"]["key"] == "ca.crt"
    cert_secret = one(objects, "Secret")["metadata"]["name"]
    assert endpoint["tlsConfig"]["ca"]["secret"]["name"] == cert_secret
    plain = template({"metrics": {"tls": True}, "webhook": {"enabled": False}}, tmp=tmp_path)
    assert plain.returncode != 0 and "metrics.tls" in plain.stderr


def test_metrics_are_plain_http_by_default(default_objects: list[dict[str, Any]]) -> None:
    c = container(default_objects)
    assert not [a for a in c["args"] if a.startswith("--metrics-cert")]
    assert "scheme" not in c["livenessProbe"]["httpGet"]


def test_network_policy_admits_only_the_webhook_and_the_metrics_port(
    default_objects: list[dict[str, Any]],
) -> None:
    policy = one(default_objects, "NetworkPolicy")["spec"]
    deploy = one(default_objects, "Deployment")
    assert policy["podSelector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    assert policy["policyTypes"] == ["Ingress"]
    ports = {c["name"]: c["containerPort"] for c in container(default_objects)["ports"]}
    webhook, metrics = policy["ingress"]
    assert webhook["ports"] == [{"port": ports["webhook"], "protocol": "TCP"}]
    assert "from" not in webhook, "default: any source (the apiserver's address varies)"
    assert metrics["ports"] == [{"port": ports["health"], "protocol": "TCP"}]
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]


def test_network_policy_sources_are_configurable_and_it_can_be_turned_off(
    tmp_path: Path,
) -> None:
    apiserver = [{"ipBlock": {"cidr": "10.0.0.0/28"}}]
    scraper = [{"namespaceSelector": {"matchLabels": {"team": "obs"}}, "podSelector": {}}]
    objects = render(
        {"networkPolicy": {"webhookFrom": apiserver, "metricsFrom": scraper}}, tmp=tmp_path
    )
    webhook, metrics = one(objects, "NetworkPolicy")["spec"]["ingress"]
    assert webhook["from"] == apiserver and metrics["from"] == scraper
    # no webhook, no scraper: nothing may come in
    closed = render(
        {"webhook": {"enabled": False}, "networkPolicy": {"metricsFrom": []}}, tmp=tmp_path
    )
    assert one(closed, "NetworkPolicy")["spec"]["ingress"] == []
    assert not by_kind(render({"networkPolicy": {"enabled": False}}, tmp=tmp_path), "NetworkPolicy")
