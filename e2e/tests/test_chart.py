"""The helm chart on the real control plane: its renders accepted by the apiserver, `helm
install`, the ServiceAccount's permissions both ways, the controller running as that
ServiceAccount placing a gang, `helm upgrade` and `helm uninstall`.

The chart's Deployment cannot really run here (the nodes are KWOK's; no kubelet runs an
image), so its pod is kept Pending by a nodeSelector no node has, and the controller runs
on the host as `nexus-admit run` with a kubeconfig holding a token of the chart's
ServiceAccount (`kubectl create token`). Its webhook is registered by URL the way
e2e/nexus_controller.py does; the chart's own MutatingWebhookConfiguration (pointing at the
Service no pod serves) gets a namespaceSelector no namespace matches, and is checked through
server-side dry runs and the objects helm creates. The release is uninstalled at the end
(the last test checks what that leaves).
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import cluster_queue, flavor_quota, job, local_queue
from e2e_util import (
    AUTO_GATE_MODE,
    KUEUE_GROUP,
    KUEUE_VERSION,
    condition,
    wait_for,
)
from kubernetes import client
from nexus_controller import NexusController

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nexus_admit.kube import labels as L  # noqa: E402
from tests.charts.helm import CHART, POLICY_API, bin_dir, render  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

RELEASE, NS = "nexus-chart", "nexus-chart-e2e"
FULLNAME = f"{RELEASE}-nexus-admit"
SA = f"system:serviceaccount:{NS}:{FULLNAME}"
LEASE = FULLNAME  # the chart's --lease-name
CHECK, CONFIG = "nexus-chart-placement", "nexus-chart"
CQ, FLAVOR, JOBS_NS = "nexus-chart-gold", "nexus-chart-any", "nexus-chart-jobs"
RR = ("scheduling.kubenexus.io", "v1alpha1", "resourcereservations")
RESERVATION = L.LABEL_RESERVATION
GATE = L.GATE_PLACEMENT
# the in-cluster webhook cannot be served here: select no namespace at all
NO_NAMESPACE = {"matchLabels": {"scheduling.kubenexus.io/chart-e2e-gated": "never"}}
INSTALL_VALUES: dict[str, Any] = {
    "admissionCheck": {"name": CHECK},
    "placementConfig": {"name": CONFIG},
    "webhook": {"namespaceSelector": NO_NAMESPACE},
    "nodeSelector": {"scheduling.kubenexus.io/chart-e2e": "no-such-node"},
}
_state: dict[str, Any] = {}


def helm(cluster: Any, *args: str, check: bool = True) -> str:
    r = subprocess.run(
        [str(bin_dir() / "helm"), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if check:
        assert r.returncode == 0, f"helm {' '.join(args)}:\n{r.stderr}"
    return r.stdout + r.stderr


def values_file(tmp: Path, values: dict[str, Any]) -> str:
    f = tmp / f"values-{len(list(tmp.iterdir()))}.yaml"
    f.write_text(yaml.safe_dump(values))
    return str(f)


def kubectl_json(cluster: Any, *args: str) -> dict[str, Any] | None:
    r = cluster.kubectl(*args, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def install_values(gate_mode: str) -> dict[str, Any]:
    """INSTALL_VALUES (`webhook.gateMode: auto`) when `gate_mode` is what `auto` picks on
    this plane (the policies on 1.36, the webhook on the oldest plane: the install then
    checks `auto`'s choice), else that mode named."""
    if gate_mode == AUTO_GATE_MODE:
        return INSTALL_VALUES
    return {**INSTALL_VALUES, "webhook": {**INSTALL_VALUES["webhook"], "gateMode": gate_mode}}


def _wait_namespace_gone(e2e_cluster: Any, timeout: float = 180) -> None:
    """NS from an earlier module's release may still be terminating (its uninstall deletes
    it without waiting): nothing can be created in it until it is gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = e2e_cluster.kubectl(
            "get", "namespace", NS, "-o", "jsonpath={.status.phase}", check=False
        )
        if r.returncode != 0 or r.stdout.strip() != "Terminating":
            return
        time.sleep(1)
    raise AssertionError(f"namespace {NS} still terminating after {timeout:.0f} s")


@pytest.fixture(scope="module")
def release(
    e2e_cluster: Any, tmp_path_factory: pytest.TempPathFactory, gate_mode: str
) -> Iterator[str]:
    """The chart installed as RELEASE in NS (a namespace enforcing the restricted Pod
    Security Standard); uninstalled afterwards."""
    tmp = tmp_path_factory.mktemp("chart-values")
    _wait_namespace_gone(e2e_cluster)  # another module's install (the other gate mode) left
    e2e_cluster.kubectl("create", "namespace", NS, check=False)
    e2e_cluster.kubectl(
        "label", "--overwrite", "namespace", NS, "pod-security.kubernetes.io/enforce=restricted"
    )
    t0 = time.monotonic()
    out = helm(
        e2e_cluster,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        NS,
        "-f",
        values_file(tmp, install_values(gate_mode)),
    )
    print(f"\n[chart] helm install: {time.monotonic() - t0:.1f}s")
    _state["install_output"] = out
    _state["tmp"] = tmp
    yield RELEASE
    helm(e2e_cluster, "uninstall", RELEASE, "-n", NS, "--ignore-not-found", check=False)
    e2e_cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)


# ---- renders and install ---------------------------------------------------------------------

DRY_RUN_VARIANTS = {
    "default": {},
    "non-default": {
        "fullnameOverride": "nexus-dry-custom",
        "webhook": {"timeoutSeconds": 2, "excludedNamespaces": ["kube-system"]},
        "admissionCheck": {"name": "nexus-dry-check"},
        "placementConfig": {
            "name": "nexus-dry-config",
            "spec": {"topology": {"topologyName": "gpu-fabric"}, "solver": {"workers": 2}},
        },
        "podDisruptionBudget": {"enabled": True, "minAvailable": "50%"},
        "serviceMonitor": {"enabled": True},
        "certManager": {"enabled": True},
    },
    "no-webhook": {"webhook": {"enabled": False}, "rbac": {"create": True}},
}
# kinds whose CRDs (cert-manager, prometheus-operator) this control plane does not have
NOT_SERVED = {"Certificate", "Issuer", "ServiceMonitor"}


@pytest.mark.parametrize("variant", list(DRY_RUN_VARIANTS))
def test_rendered_manifests_are_accepted_by_the_apiserver(
    variant: str, release: str, e2e_cluster: Any, tmp_path: Path
) -> None:
    objects = render(
        DRY_RUN_VARIANTS[variant],
        release="nexus-dry",
        namespace=NS,
        tmp=tmp_path,
        include_crds=True,
        api_versions=[POLICY_API],  # what this 1.36 apiserver serves: the gate policy too
    )
    sent = [o for o in objects if o["kind"] not in NOT_SERVED]
    skipped = sorted({o["kind"] for o in objects} - {o["kind"] for o in sent})
    r = e2e_cluster.kubectl(
        "apply",
        "--dry-run=server",
        "--server-side",
        "--force-conflicts",
        "--field-manager=chart-dry-run",
        "-f",
        "-",
        input=yaml.safe_dump_all(sent),
        check=False,
    )
    assert r.returncode == 0, r.stderr
    applied = [line for line in r.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(sent), r.stdout
    print(f"\n[chart] {variant}: {len(sent)} objects accepted; not served here: {skipped}")

    # the control: the same apiserver refuses a broken webhook object
    (mwc,) = [o for o in sent if o["kind"] == "MutatingWebhookConfiguration"] or [None]
    if mwc is not None:
        mwc["webhooks"][0]["failurePolicy"] = "Sometimes"
        bad = e2e_cluster.kubectl(
            "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(mwc), check=False
        )
        assert bad.returncode != 0 and "failurePolicy" in bad.stderr


def test_helm_install_creates_the_objects_and_prints_the_cluster_queue_line(
    release: str, e2e_cluster: Any, gate_mode: str
) -> None:
    out = _state["install_output"]
    assert "STATUS: deployed" in out
    assert f"admissionChecksStrategy: {{admissionChecks: [{{name: {CHECK}}}]}}" in out
    for crd in ("resourcereservations", "placementconfigs"):
        e2e_cluster.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            f"crd/{crd}.scheduling.kubenexus.io",
        )
    check = kubectl_json(e2e_cluster, "get", "admissionchecks.kueue.x-k8s.io", CHECK)
    assert check and check["spec"]["controllerName"] == "kubenexus.io/placement"
    assert check["spec"]["parameters"]["name"] == CONFIG
    config = kubectl_json(e2e_cluster, "get", "placementconfigs.scheduling.kubenexus.io", CONFIG)
    assert config and config["spec"]["defaultTier"] == "bronze"
    mwc = kubectl_json(e2e_cluster, "get", "mutatingwebhookconfiguration", FULLNAME)
    assert mwc is not None
    secret = kubectl_json(e2e_cluster, "get", "secret", "-n", NS, f"{FULLNAME}-webhook-cert")
    assert secret and mwc["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    if gate_mode == "policy":
        assert_gated_by_policies(e2e_cluster, mwc)
    else:
        assert_gated_by_webhook(e2e_cluster, mwc)
    svc = kubectl_json(e2e_cluster, "get", "service", "-n", NS, FULLNAME)
    assert svc and {p["name"] for p in svc["spec"]["ports"]} == {"webhook", "metrics"}
    _state["ca"] = secret["data"]["ca.crt"]


def assert_gated_by_policies(cluster: Any, mwc: dict[str, Any]) -> None:
    # with the gate policies (this 1.36 apiserver serves them) the webhook keeps two hooks:
    # pods created with a reservation label by others than the Job controller, and the Job
    # controller's, pinned at creation (webhook.pinAtCreation, on by default; never
    # refused); queued pods are gated by the queue gate policy, never sent to the webhook
    hooks = {h["name"]: h for h in mwc["webhooks"]}
    assert list(hooks) == ["pod-gate.scheduling.kubenexus.io", "pod-pin.scheduling.kubenexus.io"]
    assert {h["clientConfig"]["service"]["name"] for h in hooks.values()} == {FULLNAME}
    pin = hooks["pod-pin.scheduling.kubenexus.io"]
    assert pin["clientConfig"]["service"]["path"] == "/pod-pin"
    assert (pin["failurePolicy"], pin["matchConditions"][0]["name"]) == (
        "Ignore", "trusted-creator")
    queue_policy = kubectl_json(cluster, "get", "mutatingadmissionpolicy", f"{FULLNAME}-queue-gate")
    assert queue_policy and queue_policy["spec"]["paramKind"]["kind"] == "ConfigMap"
    # helm asked this 1.36 apiserver what it serves: the policy gates the Job controller's pods
    policy = kubectl_json(cluster, "get", "mutatingadmissionpolicy", f"{FULLNAME}-pod-gate")
    binding = kubectl_json(cluster, "get", "mutatingadmissionpolicybinding", f"{FULLNAME}-pod-gate")
    assert policy and binding
    assert binding["spec"]["matchResources"]["namespaceSelector"] == NO_NAMESPACE
    # not reinvoked after the pin hook, which takes the gate off a pod it pins
    assert policy["spec"]["reinvocationPolicy"] == "Never"
    assert mwc["webhooks"][0]["matchConditions"][0]["name"] == "untrusted-creator"


def assert_gated_by_webhook(cluster: Any, mwc: dict[str, Any]) -> None:
    # no policy: every reservation-labelled pod, every queued pod and every pod Kueue
    # suspends through a StatefulSet goes to the webhook (each hook accepted by the
    # apiserver: the StatefulSet hook's CEL condition compiled), in the namespaces chosen
    hooks = {h["name"]: h for h in mwc["webhooks"]}
    assert set(hooks) == {
        f"{name}.scheduling.kubenexus.io"
        for name in ("pod-gate", "queued-pod-gate", "statefulset-pod-gate")
    }
    for hook in hooks.values():
        assert hook["clientConfig"]["service"]["name"] == FULLNAME
        assert hook["namespaceSelector"] == NO_NAMESPACE  # no pod serves it here
    assert "matchConditions" not in hooks["pod-gate.scheduling.kubenexus.io"], (
        "the Job controller's pods are the webhook's too"
    )
    for kind in ("mutatingadmissionpolicy", "mutatingadmissionpolicybinding"):
        for gate in ("pod-gate", "queue-gate"):
            assert kubectl_json(cluster, "get", kind, f"{FULLNAME}-{gate}") is None
    assert kubectl_json(cluster, "get", "configmap", "-n", NS, f"{FULLNAME}-gated-queues") is None
    deploy = kubectl_json(cluster, "get", "deployment", "-n", NS, FULLNAME)
    assert deploy is not None
    args = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--queue-gate-configmap")], args


def test_controller_pod_is_admitted_under_the_restricted_pod_security_standard(
    release: str, e2e_cluster: Any
) -> None:
    # the ReplicaSet could create the pod in a namespace that enforces `restricted`
    pods = wait_for(
        "the controller pod",
        lambda: (
            kubectl_json(
                e2e_cluster, "get", "pods", "-n", NS, "-l", f"app.kubernetes.io/instance={RELEASE}"
            )
            or {}
        ).get("items"),
        timeout=60,
    )
    assert len(pods) == 2  # replicaCount's default: two, with leader election
    # the control: the same pod with privilege escalation allowed is refused there
    deploy = kubectl_json(e2e_cluster, "get", "deployment", "-n", NS, FULLNAME)
    assert deploy is not None
    spec = deploy["spec"]["template"]["spec"]
    spec["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pss-probe"}, "spec": spec}
    bad = e2e_cluster.kubectl(
        "create", "-n", NS, "--dry-run=server", "-f", "-", input=json.dumps(pod), check=False
    )
    assert bad.returncode != 0 and "allowPrivilegeEscalation" in bad.stderr, bad.stderr


# ---- the ServiceAccount ----------------------------------------------------------------------

MUST = [
    ("list", "nodes"),
    ("watch", "nodes"),
    ("watch", "pods", "--all-namespaces"),
    ("patch", "pods", "-n", "default"),
    ("get", "jobs.batch", "-n", "default"),  # a Workload's Job, read on demand
    ("watch", "workloads.kueue.x-k8s.io", "--all-namespaces"),
    ("get", "workloads.kueue.x-k8s.io", "-n", "default"),
    ("patch", "workloads.kueue.x-k8s.io", "--subresource=status", "-n", "default"),
    # blockOwnerDeletion on the reservation's ownerReference (OwnerReferencesPermissionEnforcement)
    ("update", "workloads.kueue.x-k8s.io", "--subresource=finalizers", "-n", "default"),
    ("watch", "localqueues.kueue.x-k8s.io", "--all-namespaces"),
    ("watch", "clusterqueues.kueue.x-k8s.io"),
    ("watch", "resourceflavors.kueue.x-k8s.io"),
    ("watch", "topologies.kueue.x-k8s.io"),
    ("watch", "admissionchecks.kueue.x-k8s.io"),
    ("patch", "admissionchecks.kueue.x-k8s.io", "--subresource=status"),
    ("watch", "noderesourcetopologies.topology.node.k8s.io"),
    ("watch", "resourceslices.resource.k8s.io"),
    ("watch", "resourceclaims.resource.k8s.io", "--all-namespaces"),
    ("watch", "resourceclaimtemplates.resource.k8s.io", "--all-namespaces"),
    ("watch", "placementconfigs.scheduling.kubenexus.io"),
    ("create", "resourcereservations.scheduling.kubenexus.io", "-n", "default"),
    ("delete", "resourcereservations.scheduling.kubenexus.io", "-n", "default"),
    ("patch", "resourcereservations.scheduling.kubenexus.io", "--subresource=status", "-n", "x"),
    ("create", "events.events.k8s.io", "-n", "default"),
    # /metrics behind authentication and authorisation (the chart's metrics.auth default)
    ("create", "tokenreviews.authentication.k8s.io"),
    ("create", "subjectaccessreviews.authorization.k8s.io"),
    ("get", "leases.coordination.k8s.io", "-n", NS),
    ("create", "leases.coordination.k8s.io", "-n", NS),
    ("update", "leases.coordination.k8s.io", "-n", NS),
]
MUST_NOT = [
    ("get", "secrets", "-n", NS),
    ("get", f"secrets/{FULLNAME}-webhook-cert", "-n", NS),
    ("list", "secrets", "--all-namespaces"),
    ("get", "secrets", "-n", "kube-system"),
    ("patch", "nodes"),
    ("update", "nodes"),
    ("delete", "nodes"),
    ("patch", "nodes", "--subresource=status"),
    ("create", "pods", "-n", "default"),
    ("delete", "pods", "-n", "default"),
    ("create", "pods", "--subresource=binding", "-n", "default"),
    ("patch", "workloads.kueue.x-k8s.io", "-n", "default"),
    ("update", "workloads.kueue.x-k8s.io", "-n", "default"),
    ("delete", "workloads.kueue.x-k8s.io", "-n", "default"),
    ("patch", "clusterqueues.kueue.x-k8s.io"),
    ("patch", "placementconfigs.scheduling.kubenexus.io"),
    ("patch", "jobs.batch", "-n", "default"),
    ("watch", "jobs.batch", "--all-namespaces"),  # read on demand, never watched
    ("create", "events", "-n", "default"),  # core Events: kopf's posting is off
    ("create", "mutatingwebhookconfigurations.admissionregistration.k8s.io"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    # a kind not served at start-up is listed again until it is: no CRD watch (informer.py)
    ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
    ("list", "namespaces"),
    ("create", "serviceaccounts/token", "-n", NS),
    ("escalate", "clusterroles.rbac.authorization.k8s.io"),
    ("update", "leases.coordination.k8s.io", "-n", "default"),
    ("update", "leases.coordination.k8s.io", "-n", "kube-system"),
    ("delete", "leases.coordination.k8s.io", "-n", NS),
    ("*", "*"),
]


def can_i(cluster: Any, args: tuple[str, ...]) -> str:
    r = cluster.kubectl("auth", "can-i", *args, f"--as={SA}", check=False)
    return r.stdout.strip()


def test_service_account_can_do_what_the_controller_does_and_nothing_more(
    release: str, e2e_cluster: Any, gate_mode: str
) -> None:
    # the queue list only the queue gate policy reads: written in policy mode only
    queue_list = ("patch", f"configmaps/{FULLNAME}-gated-queues", "-n", NS)
    if gate_mode == "policy":
        must, must_not = [*MUST, queue_list], MUST_NOT
    else:
        must, must_not = MUST, [*MUST_NOT, queue_list]
    denied = [a for a in must if can_i(e2e_cluster, a) != "yes"]
    allowed = [a for a in must_not if can_i(e2e_cluster, a) != "no"]
    assert not denied, f"the chart's ServiceAccount cannot: {denied}"
    assert not allowed, f"the chart's ServiceAccount can: {allowed}"


# ---- the controller as the chart's ServiceAccount ----------------------------------------


class ServiceAccountController(NexusController):
    """`nexus-admit run` on the host, logged in with a token of the chart's ServiceAccount;
    its webhook registered by URL under its own name."""

    def __init__(self, cluster: Any, kubeconfig: Path, gate_mode: str = "policy"):
        # with leader election as the chart runs it: the Lease in the release namespace
        super().__init__(
            cluster,
            gate_mode=gate_mode,
            name="nexus-admit-chart-sa",
            extra_args=[
                "--leader-elect",
                f"--lease-namespace={NS}",
                f"--lease-name={LEASE}",
                "--metrics-auth=kubernetes",  # the chart's default (metrics.auth)
            ],
        )
        self.sa_kubeconfig = kubeconfig
        self.metrics_tls = True  # metrics.tls: the webhook's certificate on the health port
        self.webhook_config_name = self.policy_name = f"{RELEASE}-e2e-local"
        self.log_file.unlink(missing_ok=True)  # this run's log only

    def argv(self) -> list[str]:
        # the ServiceAccount may write only its own release's queue list, as the chart runs it
        own = {
            "--kubeconfig=": f"--kubeconfig={self.sa_kubeconfig}",
            "--queue-gate-configmap=": f"--queue-gate-configmap={NS}/{FULLNAME}-gated-queues",
        }
        return [next((v for k, v in own.items() if a.startswith(k)), a) for a in super().argv()]

    def check_active(self) -> bool:
        check = kubectl_json(self.cluster, "get", "admissionchecks.kueue.x-k8s.io", CHECK)
        return bool(check) and condition(check, "Active") == "True"


def token_kubeconfig(cluster: Any, path: Path) -> Path:
    token = cluster.kubectl("create", "token", FULLNAME, "-n", NS, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    server = admin["clusters"][0]["cluster"]["server"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "e2e",
                        "cluster": {
                            "server": server,
                            "certificate-authority": str(cluster.pki / "ca.crt"),
                        },
                    }
                ],
                "users": [{"name": FULLNAME, "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": FULLNAME}}],
                "current-context": "sa",
            }
        )
    )
    path.chmod(0o600)
    return path


def kueue_objects() -> list[dict[str, Any]]:
    group = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
    return [
        {"apiVersion": group, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}, "spec": {}},
        cluster_queue(CQ, [CHECK], [flavor_quota(FLAVOR, cpu="512", memory="4096Gi")],
                      tier="gold"),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": JOBS_NS}},
    ]


def delete_kueue_objects(cluster: Any) -> None:
    cluster.kubectl("delete", "namespace", JOBS_NS, "--ignore-not-found", "--wait=false")
    cluster.kubectl(
        "delete", "clusterqueues.kueue.x-k8s.io", CQ, "--ignore-not-found", "--wait=false"
    )
    cluster.kubectl("delete", "resourceflavors.kueue.x-k8s.io", FLAVOR, "--ignore-not-found")


@pytest.fixture(scope="module")
def sa_controller(
    release: str, e2e_cluster: Any, core_v1: client.CoreV1Api, gate_mode: str
) -> Iterator[ServiceAccountController]:
    kubeconfig = token_kubeconfig(e2e_cluster, e2e_cluster.state / "chart-sa.kubeconfig")
    e2e_cluster.apply(kueue_objects())
    wait_for(
        f"default ServiceAccount in {JOBS_NS}",
        lambda: core_v1.read_namespaced_service_account("default", JOBS_NS),
        timeout=60,
    )
    e2e_cluster.apply([local_queue("chart", JOBS_NS, CQ)])
    nc = ServiceAccountController(e2e_cluster, kubeconfig, gate_mode)
    nc.register_admission()
    t0 = time.monotonic()
    try:
        nc.start()
        print(f"\n[chart] controller as {SA} ready in {time.monotonic() - t0:.1f}s")
        yield nc
    finally:
        nc.stop()
        nc.uninstall_webhook()
        delete_kueue_objects(e2e_cluster)


def gang_job(name: str) -> client.V1Job:
    return job(name, "chart", pods=2, gpus=4, cpu="4", memory="16Gi")


def our_check(wl: dict[str, Any]) -> dict[str, Any]:
    entries = (wl.get("status") or {}).get("admissionChecks") or []
    return next((c for c in entries if c.get("name") == CHECK), {})


def test_the_controller_as_the_chart_service_account_places_a_gang(
    sa_controller: ServiceAccountController,
    core_v1: client.CoreV1Api,
    batch_v1: client.BatchV1Api,
    custom_objects: client.CustomObjectsApi,
) -> None:
    t0 = time.monotonic()
    batch_v1.create_namespaced_job(JOBS_NS, gang_job("gang"))

    def ready() -> dict[str, Any] | None:
        items = custom_objects.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, JOBS_NS, "workloads"
        )["items"]
        return next((w for w in items if our_check(w).get("state") == "Ready"), None)

    wl = wait_for("check Ready", ready, timeout=90)
    t_ready = time.monotonic()
    entry = our_check(wl)
    assert "placed 2 pods" in entry["message"], entry
    rr_name = entry["podSetUpdates"][0]["labels"][RESERVATION]
    rr = custom_objects.get_namespaced_custom_object(*RR[:2], JOBS_NS, RR[2], rr_name)
    assert rr["metadata"]["ownerReferences"][0]["uid"] == wl["metadata"]["uid"]
    slots = {s["index"]: s["node"] for ps in rr["spec"]["podSets"] for s in ps["slots"]}

    def running() -> list[client.V1Pod] | None:
        pods = core_v1.list_namespaced_pod(JOBS_NS, label_selector="job-name=gang").items
        up = [p for p in pods if p.status.phase == "Running" and p.spec.node_name]
        return up if len(up) == 2 else None

    pods = wait_for("2 pods Running", running, timeout=120)
    for p in pods:
        index = int(p.metadata.annotations["batch.kubernetes.io/job-completion-index"])
        assert p.spec.node_name == slots[index], "bound to the reserved node"
        assert p.spec.node_selector["kubernetes.io/hostname"] == p.spec.node_name
        assert not [g for g in p.spec.scheduling_gates or [] if g.name == GATE]

    def bound() -> bool:
        got = custom_objects.get_namespaced_custom_object(*RR[:2], JOBS_NS, RR[2], rr_name)
        return (got.get("status") or {}).get("phase") == "Bound"

    wait_for("reservation Bound (status written as the ServiceAccount)", bound, timeout=60)
    placed = core_v1.list_namespaced_event(JOBS_NS, field_selector="reason=Placed").items
    assert placed, "the Placed Event (events.k8s.io) was written"
    lease = client.CoordinationV1Api(core_v1.api_client).read_namespaced_lease(LEASE, NS)
    assert sa_controller.proc is not None
    assert lease.spec.holder_identity.endswith(f"_{sa_controller.proc.pid}"), "it leads"
    # RBAC refusals of the ServiceAccount (the apiserver's words), and kopf's own
    log = sa_controller.log_tail(5000)
    for refusal in (f'forbidden: User \\"{SA}\\"', f'forbidden: User "{SA}"', "Not enough perm"):
        assert refusal not in log, f"the controller met {refusal!r}:\n{log}"
    _state["reservation"] = rr_name
    print(
        f"\n[chart] as the ServiceAccount: submit→Ready {t_ready - t0:.1f}s, "
        f"→2 Running {time.monotonic() - t0:.1f}s"
    )


def test_blocking_the_workloads_deletion_needs_the_finalizers_grant(
    sa_controller: ServiceAccountController,
    e2e_cluster: Any,
    custom_objects: client.CustomObjectsApi,
) -> None:
    """The plane's apiserver runs OwnerReferencesPermissionEnforcement (on in OpenShift):
    an ownerReference with blockOwnerDeletion, as every reservation has, may be set only by
    who may update the owner's finalizers. The chart's ServiceAccount placed a gang above,
    so it may (`workloads/finalizers`); one that may create reservations and nothing else
    is refused the same reservation (server-side dry runs)."""
    assert "reservation" in _state, "the placing test above ran first"
    rr = custom_objects.get_namespaced_custom_object(*RR[:2], JOBS_NS, RR[2], _state["reservation"])
    copy = {
        "apiVersion": rr["apiVersion"],
        "kind": rr["kind"],
        "metadata": {
            "name": f"{rr['metadata']['name']}-copy",
            "namespace": JOBS_NS,
            "ownerReferences": rr["metadata"]["ownerReferences"],
        },
        "spec": rr["spec"],
    }
    assert copy["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    writer = "rr-writer"
    e2e_cluster.kubectl("create", "serviceaccount", writer, "-n", JOBS_NS, check=False)
    e2e_cluster.kubectl(
        "create",
        "role",
        writer,
        "-n",
        JOBS_NS,
        "--verb=create",
        f"--resource={RR[2]}.{RR[0]}",
        check=False,
    )
    e2e_cluster.kubectl(
        "create",
        "rolebinding",
        writer,
        "-n",
        JOBS_NS,
        f"--role={writer}",
        f"--serviceaccount={JOBS_NS}:{writer}",
        check=False,
    )
    try:

        def create_as(user: str) -> subprocess.CompletedProcess[str]:
            return e2e_cluster.kubectl(
                "create",
                "--dry-run=server",
                f"--as={user}",
                "-f",
                "-",
                input=json.dumps(copy),
                check=False,
            )

        refused = create_as(f"system:serviceaccount:{JOBS_NS}:{writer}")
        assert refused.returncode != 0
        assert "cannot set blockOwnerDeletion" in refused.stderr, refused.stderr
        allowed = create_as(SA)
        assert allowed.returncode == 0, allowed.stderr
    finally:
        for kind in ("rolebinding", "role", "serviceaccount"):
            e2e_cluster.kubectl("delete", kind, writer, "-n", JOBS_NS, "--ignore-not-found")


# ---- what the ServiceAccount may change (the least-privilege policies) -----------------

POLICY = f"{FULLNAME}-least-privilege"
OWN_GATE_POD, OTHER_GATE_POD, OTHER_CHECK = "lp-own-gate", "lp-other-gate", "lp-other-check"


def as_sa(cluster: Any, *args: str, patch: Any) -> tuple[bool, str]:
    """A server-side dry run of `kubectl patch` as the controller's ServiceAccount: the
    apiserver runs admission (RBAC, then the policies) and stores nothing."""
    r = cluster.kubectl(
        "patch",
        *args,
        f"--as={SA}",
        "--dry-run=server",
        "-p",
        json.dumps(patch),
        check=False,
    )
    return r.returncode == 0, r.stderr


def gated_pod(name: str, gate: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": JOBS_NS, "labels": {"app": "lp"}},
        "spec": {
            "schedulingGates": [{"name": gate}],
            "containers": [{"name": "c", "image": "registry.invalid/pause:e2e"}],
        },
    }


@pytest.fixture(scope="module")
def policy_targets(sa_controller: ServiceAccountController, e2e_cluster: Any) -> Iterator[None]:
    """Two gated pods (ours and someone else's gate) and an AdmissionCheck of another
    controller, created as admin; the ServiceAccount's writes to them are dry runs."""
    other_check = {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "AdmissionCheck",
        "metadata": {"name": OTHER_CHECK},
        "spec": {"controllerName": "example.com/someone-else"},
    }
    e2e_cluster.apply(
        [gated_pod(OWN_GATE_POD, GATE), gated_pod(OTHER_GATE_POD, "example.com/hold"), other_check]
    )
    yield
    for obj in (("pod", OWN_GATE_POD, "-n", JOBS_NS), ("pod", OTHER_GATE_POD, "-n", JOBS_NS)):
        e2e_cluster.kubectl("delete", *obj, "--ignore-not-found", "--wait=false", check=False)
    e2e_cluster.kubectl(
        "delete", "admissionchecks.kueue.x-k8s.io", OTHER_CHECK, "--ignore-not-found", check=False
    )


def test_the_service_account_may_change_only_the_fields_it_owns(
    policy_targets: None, e2e_cluster: Any, core_v1: client.CoreV1Api
) -> None:
    """The controller placed and ungated a gang as the ServiceAccount under these policies
    (the test above); here every other change it could make through RBAC is refused."""
    for suffix in ("pods", "checks"):
        assert kubectl_json(e2e_cluster, "get", "validatingadmissionpolicy", f"{POLICY}-{suffix}")
    _pod_writes_only_its_own(e2e_cluster, core_v1)
    _status_writes_only_its_own(e2e_cluster)


def _pod_writes_only_its_own(e2e_cluster: Any, core_v1: client.CoreV1Api) -> None:
    """Its own annotation, gate and pin pass; a tenant's fields, another's gate do not."""
    (running, *_) = core_v1.list_namespaced_pod(JOBS_NS, label_selector="job-name=gang").items
    pod = ("pod", running.metadata.name, "-n", JOBS_NS)
    slot_key = "scheduling.kubenexus.io/slot"
    image = running.spec.containers[0].image
    allowed = {
        "its own annotation": (pod, {"metadata": {"annotations": {slot_key: "main/9"}}}),
    }
    refused = {
        "a tenant's label": (pod, {"metadata": {"labels": {"app": "x"}}}, "labels of a pod"),
        "a tenant's annotation": (
            pod,
            {"metadata": {"annotations": {"example.com/owner": "x"}}},
            "annotations of a pod",
        ),
        "the image": (
            pod,
            {"spec": {"containers": [{"name": "worker", "image": image + "-evil"}]}},
            "scheduling gates, nodeSelector and affinity",
        ),
        "a deadline": (  # the apiserver lets a pod's activeDeadlineSeconds be set
            pod,
            {"spec": {"activeDeadlineSeconds": 3600}},
            "scheduling gates, nodeSelector and affinity",
        ),
        "a finalizer": (pod, {"metadata": {"finalizers": ["example.com/x"]}}, "finalizers"),
        "someone else's gate": (
            ("pod", OTHER_GATE_POD, "-n", JOBS_NS),
            {"spec": {"schedulingGates": [{"$patch": "delete", "name": "example.com/hold"}]}},
            "only remove its own scheduling gate",
        ),
        "pinning a pod it did not gate": (
            ("pod", OTHER_GATE_POD, "-n", JOBS_NS),
            {"spec": {"nodeSelector": {"kubernetes.io/hostname": "h100-r0-0"}}},
            "only a pod that carries its scheduling gate",
        ),
    }
    # the ungater's own writes pass: it pinned and ungated the gang above (nodeSelector,
    # slot annotations, gate removal in one patch) and lifts its gate from a plain pod
    wait_for(
        "the controller lifts its gate from a plain pod, as the ServiceAccount",
        lambda: (
            not [
                g
                for g in core_v1.read_namespaced_pod(OWN_GATE_POD, JOBS_NS).spec.scheduling_gates
                or []
                if g.name == GATE
            ]
        ),
        timeout=60,
    )
    for what, (target, patch) in allowed.items():
        ok, err = as_sa(e2e_cluster, *target, patch=patch)
        assert ok, f"{what}: {err}"
    for what, (target, patch, words) in refused.items():
        ok, err = as_sa(e2e_cluster, *target, patch=patch)
        assert not ok, f"{what} was allowed"
        assert "denied request" in err and words in err, f"{what}: {err}"


def _status_writes_only_its_own(e2e_cluster: Any) -> None:
    """Its own check entry and AdmissionCheck status pass; another check's entry, a
    Workload condition and another AdmissionCheck do not. The ServiceAccount may patch but
    not get a status subresource, which `kubectl patch` does first: the patches go through
    the API client, impersonating it."""
    api = client.CustomObjectsApi(impersonating(e2e_cluster, SA))
    (wl,) = [
        w
        for w in e2e_cluster_workloads(e2e_cluster)
        if any(c.get("name") == CHECK for c in (w.get("status") or {}).get("admissionChecks", []))
    ][:1]
    entries = wl["status"]["admissionChecks"]
    i = next(i for i, c in enumerate(entries) if c["name"] == CHECK)

    def workload_status(patch: list[dict[str, Any]]) -> tuple[bool, str]:
        return refused_or_not(
            lambda: api.patch_namespaced_custom_object_status(
                KUEUE_GROUP,
                KUEUE_VERSION,
                JOBS_NS,
                "workloads",
                wl["metadata"]["name"],
                patch,
                dry_run="All",
                _content_type="application/json-patch+json",
            )
        )

    ok, err = workload_status(
        [{"op": "replace", "path": f"/status/admissionChecks/{i}/message", "value": "m"}]
    )
    assert ok, f"its own check entry: {err}"
    foreign_entry = {
        "name": "someone-elses-check",
        "state": "Ready",
        "message": "forged",
        "lastTransitionTime": "2030-01-01T00:00:00Z",
    }
    forged_condition = {
        "type": "Forged",
        "status": "True",
        "reason": "Forged",
        "message": "x",
        "lastTransitionTime": "2030-01-01T00:00:00Z",
    }
    refused_status = {
        "another check's entry": (
            [{"op": "add", "path": "/status/admissionChecks/-", "value": foreign_entry}],
            "its own admission check entries",
        ),
        "a Workload condition": (
            [{"op": "add", "path": "/status/conditions/-", "value": forged_condition}],
            "only status.admissionChecks",
        ),
    }
    for what, (patch, words) in refused_status.items():
        ok, err = workload_status(patch)
        assert not ok, f"{what} was allowed"
        assert "denied request" in err and words in err, f"{what}: {err}"

    def check_status(name: str) -> tuple[bool, str]:
        body = {"status": {"conditions": [{**forged_condition, "type": "Active"}]}}
        return refused_or_not(
            lambda: api.patch_cluster_custom_object_status(
                KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", name, body, dry_run="All"
            )
        )

    ok, err = check_status(CHECK)
    assert ok, f"its own AdmissionCheck: {err}"
    ok, err = check_status(OTHER_CHECK)
    assert not ok and "its own AdmissionChecks only" in err, err


def impersonating(cluster: Any, user: str) -> client.ApiClient:
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.set_default_header("Impersonate-User", user)
    return api


def refused_or_not(call: Any) -> tuple[bool, str]:
    try:
        call()
    except client.ApiException as e:
        return False, str(e.body)
    return True, ""


def e2e_cluster_workloads(cluster: Any) -> list[dict[str, Any]]:
    got = kubectl_json(cluster, "get", "workloads.kueue.x-k8s.io", "-n", JOBS_NS)
    return list((got or {}).get("items") or [])


# ---- /metrics behind the apiserver's authentication and authorisation -------------------


def http_get(url: str, token: str | None = None, tls: Any = None) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10, context=tls) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_metrics_answer_only_a_caller_the_apiserver_authorises(
    sa_controller: ServiceAccountController, e2e_cluster: Any
) -> None:
    """Served over TLS (metrics.tls): the certificate verified against the cluster's CA, and
    the port does not answer plain HTTP."""
    base, tls = sa_controller.health_url(""), sa_controller.health_tls()
    assert base.startswith("https://") and tls is not None
    with pytest.raises((OSError, http.client.HTTPException)):  # reset, or no HTTP answer
        http_get(f"http://127.0.0.1:{sa_controller.health_port}/healthz")
    scraper, binding = "metrics-scraper", f"{FULLNAME}-e2e-scraper"
    e2e_cluster.kubectl("create", "serviceaccount", scraper, "-n", NS, check=False)
    e2e_cluster.kubectl(
        "create",
        "clusterrolebinding",
        binding,
        f"--clusterrole={FULLNAME}-metrics-reader",
        f"--serviceaccount={NS}:{scraper}",
        check=False,
    )
    try:
        reader = e2e_cluster.kubectl("create", "token", scraper, "-n", NS).stdout.strip()
        other = e2e_cluster.kubectl("create", "token", FULLNAME, "-n", NS).stdout.strip()
        assert http_get(f"{base}/metrics", tls=tls)[0] == 401, "no token"
        assert http_get(f"{base}/metrics", "not-a-token", tls)[0] == 401, "a made-up token"
        status, text = http_get(f"{base}/metrics", other, tls)
        assert status == 403 and "may not get /metrics" in text, "authenticated, no role"
        status, text = http_get(f"{base}/metrics", reader, tls)
        assert status == 200 and "nexus_admit_" in text, text[:200]
        assert http_get(f"{base}/healthz", tls=tls)[0] == 200, "the kubelet's probes need no token"
    finally:
        e2e_cluster.kubectl("delete", "clusterrolebinding", binding, "--ignore-not-found")
        e2e_cluster.kubectl("delete", "serviceaccount", scraper, "-n", NS, "--ignore-not-found")


def test_helm_upgrade_changes_the_placement_config_keeps_certificate_and_reservations(
    sa_controller: ServiceAccountController,
    e2e_cluster: Any,
    custom_objects: client.CustomObjectsApi,
) -> None:
    assert "reservation" in _state, "needs the gang of the previous test"
    values = {
        **INSTALL_VALUES,
        "placementConfig": {"name": CONFIG, "spec": {"defaultTier": "silver"}},
    }
    out = helm(
        e2e_cluster,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        NS,
        "-f",
        values_file(_state["tmp"], values),
    )
    assert "STATUS: deployed" in out and "REVISION: 2" in out
    config = kubectl_json(e2e_cluster, "get", "placementconfigs.scheduling.kubenexus.io", CONFIG)
    assert config and config["spec"]["defaultTier"] == "silver"
    secret = kubectl_json(e2e_cluster, "get", "secret", "-n", NS, f"{FULLNAME}-webhook-cert")
    assert secret and secret["data"]["ca.crt"] == _state["ca"], "the certificate was reused"
    mwc = kubectl_json(e2e_cluster, "get", "mutatingwebhookconfiguration", FULLNAME)
    assert mwc and mwc["webhooks"][0]["clientConfig"]["caBundle"] == _state["ca"]
    rr = custom_objects.get_namespaced_custom_object(*RR[:2], JOBS_NS, RR[2], _state["reservation"])
    assert rr["status"]["phase"] == "Bound"
    # the running controller takes the new config from its watch: still up, ready, Active
    time.sleep(2)
    assert sa_controller.proc is not None and sa_controller.proc.poll() is None
    assert sa_controller.ready() and sa_controller.check_active()


def test_helm_uninstall_leaves_nothing_cluster_scoped_but_the_crds(
    sa_controller: ServiceAccountController, e2e_cluster: Any
) -> None:
    # Kueue keeps an AdmissionCheck a ClusterQueue still lists (finalizer): the queue goes first
    delete_kueue_objects(e2e_cluster)
    helm(e2e_cluster, "uninstall", RELEASE, "-n", NS)
    gone = [
        ("clusterrole", FULLNAME),
        ("clusterrolebinding", FULLNAME),
        ("clusterrole", f"{FULLNAME}-metrics-reader"),
        ("validatingadmissionpolicy", f"{FULLNAME}-least-privilege-pods"),
        ("validatingadmissionpolicybinding", f"{FULLNAME}-least-privilege-checks"),
        ("mutatingwebhookconfiguration", FULLNAME),
        ("mutatingadmissionpolicy", f"{FULLNAME}-pod-gate"),
        ("mutatingadmissionpolicybinding", f"{FULLNAME}-pod-gate"),
        ("admissionchecks.kueue.x-k8s.io", CHECK),
        ("placementconfigs.scheduling.kubenexus.io", CONFIG),
        ("serviceaccount", f"{FULLNAME}", "-n", NS),
        ("secret", f"{FULLNAME}-webhook-cert", "-n", NS),
    ]
    for obj in gone:
        wait_for(
            f"{obj} deleted",
            lambda o=obj: kubectl_json(e2e_cluster, "get", *o) is None,
            timeout=120,
        )
    for crd in ("resourcereservations", "placementconfigs"):
        assert kubectl_json(e2e_cluster, "get", "crd", f"{crd}.scheduling.kubenexus.io")
