"""What runs on the plane and how it is configured: the core components, Kueue's and KWOK's
configuration, and the workload controllers Kueue integrates with (JobSet,
LeaderWorkerSet, Kubeflow Trainer, KubeRay, MPI operator), each started as a process outside
any cluster.

A workload controller runs when build.sh built it (its binary is in the binary
directory, i.e. its version is pinned in versions.env); Kueue's `integrations.frameworks`
then names exactly the frameworks whose controllers run, plus the built-in kinds.
"""

from __future__ import annotations

import base64
import copy
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from plane.processes import ClusterError

CORE_COMPONENTS = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kueue",
]
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"
KUEUE_NAMESPACE = "kueue-system"
# Kueue's reconciler workers per kind, from the configuration Kueue ships
KUEUE_GROUP_KIND_CONCURRENCY = {
    "Job.batch": 5,
    "Pod": 5,
    "Workload.kueue.x-k8s.io": 10,
    "LocalQueue.kueue.x-k8s.io": 5,
    "Cohort.kueue.x-k8s.io": 1,
    "ClusterQueue.kueue.x-k8s.io": 5,
    "ResourceFlavor.kueue.x-k8s.io": 1,
}
# CRDs whose conversion webhook Kueue's own kustomization enables
# (config/components/crd/kustomization.yaml, the webhook_in_* patches).
KUEUE_CONVERSION_CRDS = {
    "localqueues.kueue.x-k8s.io",
    "clusterqueues.kueue.x-k8s.io",
    "cohorts.kueue.x-k8s.io",
    "workloads.kueue.x-k8s.io",
    "multikueueclusters.kueue.x-k8s.io",
}
# Kueue integrations whose kinds are built into Kubernetes (pkg/controller/jobs/*,
# FrameworkName): always enabled
KUEUE_BUILTIN_FRAMEWORKS = ["batch/job", "pod", "deployment", "statefulset"]
# KWOK stages shipped with kwok (kustomize/stage/...): node lifecycle + pods become Running.
# Pod completion and deletion are ours (e2e/kwok/): completion opt-in, deletion at once
# unless a pod asks to stay until the end of its grace period.
KWOK_STAGES = [
    "stage/node/fast/node-initialize.yaml",
    "stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "stage/pod/fast/pod-ready.yaml",
]


@dataclass(frozen=True)
class Launch:
    """Where a controller's files go and what it may use, handed to its command builder."""

    bin: Path
    config_dir: Path
    pki: Path
    kubeconfig: Path
    state: Path
    webhook_port: int
    health_port: int


@dataclass(frozen=True)
class WorkloadController:
    """A controller of a workload kind Kueue manages, run from its upstream binary."""

    name: str  # component name: manifests/<name>/, its log file, its entry in `status`
    binary: str
    # Kueue integrations.frameworks names (FrameworkName in Kueue's pkg/controller/jobs)
    frameworks: tuple[str, ...]
    # serves the admission webhooks in manifests/<name>/webhook (defaulting, validation,
    # pod labels): they are registered as 127.0.0.1 URLs with the plane's CA
    serves_webhooks: bool
    command: Callable[[Launch], tuple[list[str], dict[str, str]]]
    readyz: str = "/readyz"
    needs: tuple[str, ...] = ()  # other controllers its objects go through

    def installed(self, bin_dir: Path) -> bool:
        return (bin_dir / self.binary).exists()


def _config_file(launch: Launch, name: str, doc: dict[str, Any]) -> Path:
    path = launch.config_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _controller_runtime_config(launch: Launch, api_version: str, name: str) -> dict[str, Any]:
    """The kubebuilder-style Configuration that JobSet and LWS read (config.<group>/v1alpha1):
    webhooks on 127.0.0.1 with our certificate, no cert rotation, no leader election (one
    replica), no metrics server."""
    return {
        "apiVersion": api_version,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {
            "host": "127.0.0.1",
            "port": launch.webhook_port,
            "certDir": str(launch.pki / f"{name}-webhook"),
        },
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{launch.health_port}"},
    }


def _jobset(launch: Launch) -> tuple[list[str], dict[str, str]]:
    # main.go: flags win over the config file only when set; none is set here
    cfg = _controller_runtime_config(launch, "config.jobset.x-k8s.io/v1alpha1", "jobset")
    path = _config_file(launch, "jobset", cfg)
    return [str(launch.bin / "jobset-controller"), f"--config={path}"], {
        "KUBECONFIG": str(launch.kubeconfig)
    }


def _lws(launch: Launch) -> tuple[list[str], dict[str, str]]:
    cfg = _controller_runtime_config(launch, "config.lws.x-k8s.io/v1alpha1", "lws")
    path = _config_file(launch, "lws", cfg)
    # cmd/main.go: --leader-elect defaults to true but only a flag that is set overrides the
    # config file; say it anyway so that no default ever turns it on
    return [
        str(launch.bin / "lws-controller"),
        f"--config={path}",
        "--leader-elect=false",
    ], {"KUBECONFIG": str(launch.kubeconfig)}


def _trainer(launch: Launch) -> tuple[list[str], dict[str, str]]:
    # Trainer's Configuration has no webhook certDir: controller-runtime then reads
    # $TMPDIR/k8s-webhook-server/serving-certs/tls.{crt,key}; give it a TMPDIR of its own
    tmp = launch.state / "trainer-tmp"
    certs = tmp / "k8s-webhook-server" / "serving-certs"
    certs.mkdir(parents=True, exist_ok=True)
    for f in ("tls.crt", "tls.key"):
        (certs / f).write_bytes((launch.pki / "trainer-webhook" / f).read_bytes())
    cfg = {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "health": {
            "healthProbeBindAddress": f"127.0.0.1:{launch.health_port}",
            "readinessEndpointName": "readyz",
            "livenessEndpointName": "healthz",
        },
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": launch.webhook_port},
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": False},
    }
    path = _config_file(launch, "trainer", cfg)
    return [str(launch.bin / "trainer-controller-manager"), f"--config={path}"], {
        "KUBECONFIG": str(launch.kubeconfig),
        "TMPDIR": str(tmp),
    }


def _kuberay(launch: Launch) -> tuple[list[str], dict[str, str]]:
    # main.go registers its webhooks only with ENABLE_WEBHOOKS=true (the chart's default is
    # off): RayJob/RayCluster validation is optional, so they stay off here
    return [
        str(launch.bin / "kuberay-operator"),
        "--metrics-addr=0",
        f"--health-probe-bind-address=127.0.0.1:{launch.health_port}",
        "--enable-leader-election=false",
        "--log-stdout-encoder=console",
    ], {"KUBECONFIG": str(launch.kubeconfig), "ENABLE_WEBHOOKS": "false"}


def _mpi_operator(launch: Launch) -> tuple[list[str], dict[str, str]]:
    # --health-port and --leader-elect-* are our build's (e2e/build/build.sh,
    # recipe_mpi_operator): upstream fixes its health server on :8080 and its leader
    # election at a 5-s renew deadline, after which it exits. It always runs that election,
    # on a Lease in --lock-namespace (upstream's default namespace, mpi-operator, is not
    # made here); one replica on a fresh etcd, so a long lease never delays a start, and a
    # 60-s deadline outlasts the fault tests' apiserver and etcd restarts
    return [
        str(launch.bin / "mpi-operator"),
        f"--kubeConfig={launch.kubeconfig}",
        f"--health-port={launch.health_port}",
        "--leader-elect-lease-duration=90s",
        "--leader-elect-renew-deadline=60s",
        "--leader-elect-retry-period=2s",
        "--lock-namespace=kube-system",
        "--monitoring-port=0",
        "--kube-api-qps=50",
        "--kube-api-burst=100",
    ], {"KUBECONFIG": str(launch.kubeconfig)}


# In the order they start. Trainer drives its TrainJobs through JobSets, so it needs JobSet.
WORKLOAD_CONTROLLERS = [
    WorkloadController("jobset", "jobset-controller", ("jobset.x-k8s.io/jobset",), True, _jobset),
    WorkloadController(
        "lws", "lws-controller", ("leaderworkerset.x-k8s.io/leaderworkerset",), True, _lws
    ),
    WorkloadController(
        "trainer",
        "trainer-controller-manager",
        ("trainer.kubeflow.org/trainjob",),
        True,
        _trainer,
        needs=("jobset",),  # a TrainJob runs as a JobSet
    ),
    WorkloadController(
        "kuberay",
        "kuberay-operator",
        ("ray.io/rayjob", "ray.io/raycluster", "ray.io/rayservice"),
        False,
        _kuberay,
    ),
    WorkloadController(
        "mpi-operator", "mpi-operator", ("kubeflow.org/mpijob",), False, _mpi_operator,
        readyz="/healthz",
    ),
]
COMPONENTS = CORE_COMPONENTS + [c.name for c in WORKLOAD_CONTROLLERS]


def installed_controllers(bin_dir: Path) -> list[WorkloadController]:
    """The workload controllers this plane runs: those built, narrowed by
    NEXUS_E2E_CONTROLLERS (comma-separated names, or "none") when it is set."""
    built = [c for c in WORKLOAD_CONTROLLERS if c.installed(bin_dir)]
    wanted = os.environ.get("NEXUS_E2E_CONTROLLERS")
    if wanted is None:
        return built
    names = {n.strip() for n in wanted.split(",") if n.strip()} - {"none"}
    unknown = names - {c.name for c in WORKLOAD_CONTROLLERS}
    if unknown:
        raise ClusterError(
            f"NEXUS_E2E_CONTROLLERS names unknown controllers {sorted(unknown)}; known: "
            + ", ".join(c.name for c in WORKLOAD_CONTROLLERS)
        )
    missing = names - {c.name for c in built}
    if missing:
        raise ClusterError(
            f"NEXUS_E2E_CONTROLLERS asks for {sorted(missing)}, not built in {bin_dir} "
            "(their version is empty in e2e/versions.env)"
        )
    chosen = [c for c in built if c.name in names]
    for c in chosen:
        if not set(c.needs) <= names:
            raise ClusterError(f"NEXUS_E2E_CONTROLLERS: {c.name} needs {', '.join(c.needs)} too")
    return chosen


def kueue_frameworks(bin_dir: Path) -> list[str]:
    """integrations.frameworks: the built-in kinds plus those whose controller runs."""
    out = list(KUEUE_BUILTIN_FRAMEWORKS)
    for c in installed_controllers(bin_dir):
        out += c.frameworks
    return out


# --------------------------------------------------------------------------- manifests


# libyaml's loader when PyYAML has it: the controllers' CRDs are about 10 MB of YAML, which
# the pure-Python loader takes 20 s to read on this machine
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    """The non-empty documents of a YAML file."""
    return [d for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d]


def controller_crds(bin_dir: Path, controller: WorkloadController) -> list[dict[str, Any]]:
    crd_dir = bin_dir / "manifests" / controller.name / "crd"
    return [
        d
        for f in sorted(crd_dir.glob("*.yaml"))
        for d in yaml_docs(f)
        if d.get("kind") == "CustomResourceDefinition"  # not the kustomization.yaml beside them
    ]


def _json_pointer_parent(doc: Any, path: str) -> tuple[Any, str | int]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    node = doc
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    last: str | int = int(parts[-1]) if isinstance(node, list) else parts[-1]
    return node, last


def _apply_json6902(doc: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """The JSON 6902 patches the controllers' kustomizations apply to their webhook
    manifests (replace/add/remove; kustomize applies them at install time)."""
    for op in ops:
        parent, key = _json_pointer_parent(doc, op["path"])
        if op["op"] == "replace":
            parent[key] = copy.deepcopy(op["value"])
        elif op["op"] == "add":
            if isinstance(parent, list):
                parent.insert(len(parent) if key == "-" else int(key), copy.deepcopy(op["value"]))
            else:
                parent[key] = copy.deepcopy(op["value"])
        elif op["op"] == "remove":
            del parent[key]
        else:
            raise ValueError(f"unsupported patch op {op['op']!r}")


def webhook_configurations(
    webhook_dir: Path,
    prefix: str,
    port: int,
    ca_bundle: bytes,
    namespace_selector: dict[str, Any] | None = None,
    skip_groups: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """A component's Mutating/ValidatingWebhookConfigurations as its kustomization renders
    them (its JSON 6902 patches applied), each service reference rewritten to
    https://127.0.0.1:<port><path> with the plane's CA. `namespace_selector` goes on every
    webhook whose API groups are not all in `skip_groups`."""
    docs = [
        d
        for f in sorted(webhook_dir.glob("*.yaml"))
        if f.name not in ("kustomization.yaml", "kustomizeconfig.yaml")
        for d in yaml_docs(f)
    ]
    configs = [
        d
        for d in docs
        if isinstance(d, dict)
        and d.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    ]
    kustomization = webhook_dir / "kustomization.yaml"
    if kustomization.exists():
        for patch in yaml.safe_load(kustomization.read_text()).get("patches") or []:
            if "path" not in patch:
                continue  # inline strategic-merge patches (Kueue's: the namespace selector)
            target = patch.get("target") or {}
            ops = yaml.safe_load((webhook_dir / patch["path"]).read_text())
            for doc in configs:
                if target.get("kind") not in (None, doc["kind"]):
                    continue
                if target.get("name") not in (None, doc["metadata"]["name"]):
                    continue
                _apply_json6902(doc, ops)
    b64 = base64.b64encode(ca_bundle).decode()
    for doc in configs:
        doc["metadata"] = {"name": f"{prefix}-{doc['metadata']['name']}"}
        for wh in doc.get("webhooks", []):
            path = wh["clientConfig"]["service"]["path"]
            wh["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": b64}
            groups = {g for r in wh.get("rules", []) for g in r.get("apiGroups", [])}
            if namespace_selector is not None and not groups <= skip_groups:
                wh["namespaceSelector"] = namespace_selector
    return configs


def kueue_webhooks(bin_dir: Path, port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations with service refs rewritten to 127.0.0.1 URLs."""
    ns_selector = {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["kube-system", KUEUE_NAMESPACE],
            }
        ]
    }
    # the same selector Kueue's kustomization puts on every job-framework webhook
    src = bin_dir / "manifests" / "kueue" / "webhook"
    return webhook_configurations(
        src, "kueue", port, ca_bundle, ns_selector, frozenset({"kueue.x-k8s.io"})
    )


# --------------------------------------------------------------------------- core commands
# The plane's core processes; `ports` holds the free ports cluster.py picked for them.


def etcd_argv(b: Path, state: Path, ports: dict[str, int]) -> list[str]:
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    peer_url = f"http://127.0.0.1:{ports['etcd_peer']}"
    return [
        str(b / "etcd"),
        "--name=e2e",
        f"--data-dir={state / 'etcd'}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=e2e={peer_url}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync",
        "--log-level=warn",
        "--quota-backend-bytes=4294967296",
    ]


def apiserver_argv(b: Path, pki: Path, ports: dict[str, int]) -> list[str]:
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    return [
        str(b / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports['apiserver']}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--authorization-mode=Node,RBAC",
        # on top of the defaults: OpenShift enables it, and it refuses an ownerReference
        # with blockOwnerDeletion to whoever may not update the owner's finalizers (the
        # chart's RBAC grants workloads/finalizers for the reservations' ownerReference)
        "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--endpoint-reconciler-type=none",
        # NEXUS_E2E_PROFILING=1 serves /debug/pprof (where the benchmark's CPU goes)
        f"--profiling={str(os.environ.get('NEXUS_E2E_PROFILING') == '1').lower()}",
        f"--cert-dir={pki / 'apiserver-generated'}",
        "--event-ttl=1h",
        f"--requestheader-client-ca-file={pki / 'ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
    ]


def scheduler_argv(b: Path, cfg: Path, pki: Path, ports: dict[str, int]) -> list[str]:
    sched_kc = cfg / "kube-scheduler.kubeconfig"
    return [
        str(b / "kube-scheduler"),
        f"--kubeconfig={sched_kc}",
        f"--authentication-kubeconfig={sched_kc}",
        f"--authorization-kubeconfig={sched_kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['scheduler']}",
        f"--cert-dir={pki / 'scheduler-generated'}",
        "--leader-elect=false",
        "--profiling=false",
    ]


def controller_manager_argv(
    b: Path, cfg: Path, pki: Path, ports: dict[str, int], node_grace: int | None
) -> list[str]:
    kcm_kc = cfg / "kube-controller-manager.kubeconfig"
    return [
        str(b / "kube-controller-manager"),
        f"--kubeconfig={kcm_kc}",
        f"--authentication-kubeconfig={kcm_kc}",
        f"--authorization-kubeconfig={kcm_kc}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['kcm']}",
        f"--cert-dir={pki / 'kcm-generated'}",
        "--leader-elect=false",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        "--use-service-account-credentials=true",
        "--controllers=*",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        "--profiling=false",
        *([f"--node-monitor-grace-period={node_grace}s"] if node_grace else []),
    ]


# the podIPs list of KWOK's pod-ready stage, which a strategic merge adds to the pod's own
_POD_IPS_LIST = re.compile(
    r"^[ \t]*podIPs:\n[ \t]*\{\{ range \. \}\}\n[ \t]*- ip: \{\{ \. \| Quote \}\}\n"
    r"[ \t]*\{\{ end \}\}\n", re.M)


def one_pod_ip(stage: str) -> str:
    """KWOK's pod-ready stage without its `podIPs` list, `podIP` alone (the apiserver
    derives the list from it, and takes it over a list that differs).

    Why (the load benchmark sets NEXUS_E2E_KWOK_ONE_POD_IP=1): KWOK v0.8.0 draws a new IP
    from its pool each time it plays the stage, and at times plays it again on a pod it
    already made Running; the strategic merge then lists two IPs, the apiserver refuses the
    patch (422), and KWOK retries it with backoff while its workers, which play every
    pod's status, wait: 1,545 and 1,685 refused plays in the nexus phase of two runs, bound
    → Running 10 to 29 s p50 there against 0.4 to 1.4 s in Kueue's, KWOK's CPU per
    Workload 0.14 s against 0.02 s. A replay now rewrites the one IP."""
    out, found = _POD_IPS_LIST.subn("", stage)
    if found != 1:
        raise ClusterError("KWOK's pod-ready stage has no podIPs list where expected")
    return out


def played_once(stage: str) -> str:
    """KWOK's pod-ready stage written as a status patch that carries the resourceVersion of
    the pod it was played on, so that the apiserver refuses (409) a play on an old copy of a
    pod instead of writing it a second time.

    Why (the load benchmark sets NEXUS_E2E_KWOK_PLAY_ONCE=1): KWOK v0.8.0 plays a stage on
    the pod of the event it queued, and keeps no record of what it has played. An old,
    still Pending copy that reaches it after the play (a relist of its pod watch, a node's
    pod sync) is played again: 1,121 and 1,240 pods of the nexus phase in two runs got a
    second Running write with a new IP 3 to 13 s after the first, with no other write
    between, and bound → Running took 6 to 15 s p50 there against 0.15 s. KWOK does not
    retry a conflict, and a newer event of the same pod is played as before."""
    doc = yaml.safe_load(stage)
    nxt = (doc.get("spec") or {}).get("next") or {}
    template = nxt.pop("statusTemplate", None)
    if not isinstance(template, str) or nxt.get("patches"):
        raise ClusterError("KWOK's pod-ready stage has no statusTemplate where expected")
    body = "".join(f"  {line}" if line.strip() else line
                   for line in template.splitlines(keepends=True))
    nxt["patches"] = [{
        "subresource": "status",
        "template": "metadata:\n  resourceVersion: {{ .metadata.resourceVersion | Quote }}\n"
                    f"status:\n{body}",
    }]
    out: str = yaml.dump(doc, Dumper=_BlockDumper, sort_keys=False)
    return out


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, as KWOK's stages are written."""

    def represent_str(self, data: str) -> yaml.ScalarNode:
        style = "|" if "\n" in data else None
        return self.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_BlockDumper.add_representer(str, _BlockDumper.represent_str)


# the delay of KWOK's node-heartbeat-with-lease stage: a Node status write every 600 to
# 610 s (KWOK draws between the two; a jitter under the duration would replace it)
_HEARTBEAT_DELAY = re.compile(
    r"^([ \t]*delay:\n[ \t]*durationMilliseconds: )600000\n"
    r"([ \t]*jitterDurationMilliseconds: )610000$", re.M)

# a node's status heartbeat, in node grace periods, where the grace is set (bench-e2e)
STATUS_HEARTBEAT_GRACES = 4


def rare_node_status(stage: str, node_grace: int) -> str:
    """KWOK's node heartbeat stage writing each Node's status once per
    STATUS_HEARTBEAT_GRACES grace periods instead of every 600 s.

    Why (the load benchmark sets a node grace): KWOK's leases keep its nodes Ready (the
    node lifecycle controller reads a renewed lease as a heartbeat), and at 5,000 nodes
    the 600-s status rounds (8 writes a second, 1,000 to 2,800 in a phase) fell in
    whichever phase ran ten minutes after the nodes were made, starving KWOK's pod plays
    there: bound → Running 57 s p50 in one phase against 0.4 s in the other."""
    every_ms = node_grace * STATUS_HEARTBEAT_GRACES * 1000
    out, found = _HEARTBEAT_DELAY.subn(
        rf"\g<1>{every_ms}\n\g<2>{every_ms + 10_000}", stage)
    if found != 1:
        raise ClusterError("KWOK's node heartbeat stage has no 600-to-610-s delay where expected")
    return out


def kwok_config(b: Path, ports: dict[str, int], node_grace: int | None, own_stages: Path) -> str:
    """KWOK's configuration and stages: `own_stages` is e2e/kwok (every .yaml in it)."""
    conf = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector": "kwok.x-k8s.io/node=fake",
            "nodeLeaseDurationSeconds": node_grace or 40,
            "nodeLeaseParallelism": 4,
            # KWOK stands in for every node's kubelet: its default of 4 workers for all
            # pod status updates of a 1,000-node fleet queues them behind one another,
            # where real kubelets write in parallel
            "podPlayStageParallelism": 16,
            "nodePlayStageParallelism": 4,
            "enablePodsOnNodeSyncStreamWatch": True,
            "cidr": POD_CIDR,
            "nodeIP": "10.240.0.1",
            "nodePort": ports["kwok"],
            "serverAddress": f"127.0.0.1:{ports['kwok']}",
            "enableCRDs": [],
        },
    }
    parts = [yaml.safe_dump(conf, sort_keys=False)]
    kust = b / "manifests" / "kwok" / "kustomize"
    for rel in KWOK_STAGES:
        text = (kust / rel).read_text()
        if rel.endswith("/pod-ready.yaml") and os.environ.get("NEXUS_E2E_KWOK_ONE_POD_IP") == "1":
            text = one_pod_ip(text)
        if rel.endswith("/pod-ready.yaml") and os.environ.get("NEXUS_E2E_KWOK_PLAY_ONCE") == "1":
            text = played_once(text)
        if rel.endswith("/node-heartbeat-with-lease.yaml") and node_grace:
            text = rare_node_status(text, node_grace)
        parts.append(text)
    parts.extend(stage.read_text() for stage in sorted(own_stages.glob("*.yaml")))
    return "\n---\n".join(p.strip() for p in parts) + "\n"


def kueue_config(b: Path, pki: Path, ports: dict[str, int]) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue_health']}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {
            "host": "127.0.0.1",
            "port": ports["kueue_webhook"],
            "certDir": str(pki / "kueue-webhook"),
        },
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        # as Kueue ships it (config/components/manager/controller_manager_config.yaml and
        # its helm chart): without this, controller-runtime runs every reconciler with one
        # worker, and a burst of Jobs queues behind Kueue's single Job reconciler
        "controller": {"groupKindConcurrency": KUEUE_GROUP_KIND_CONCURRENCY},
        "clientConnection": {"qps": 300, "burst": 500},
        "integrations": {"frameworks": kueue_frameworks(b)},
        "featureGates": {"VisibilityOnDemand": False},
        # Dynamic Resource Allocation: devices of DeviceClass gpu.nvidia.com asked through
        # ResourceClaimTemplates count as nvidia.com/gpu, the quota the ClusterQueues already
        # hold for the extended resource (docs/dra.md, e2e/tests/test_dra_claims.py). Kueue
        # refuses a template naming a DeviceClass it has no mapping for, so a ComputeDomain's
        # channel class counts as nvidia.com/imex-channel (e2e/tests/test_dra_cliques.py)
        "resources": {
            "deviceClassMappings": [
                {"name": "nvidia.com/gpu", "deviceClassNames": ["gpu.nvidia.com"]},
                {"name": "nvidia.com/imex-channel",
                 "deviceClassNames": ["compute-domain-default-channel.nvidia.com"]},
            ]
        },
    }
