"""pytest fixtures for tests that run against the real local control plane.

Fixtures (see also e2e/e2e_util.py):

- ``e2e_cluster`` (session): the running control plane. Brings it up once per test run
  (``e2e/cluster.py up``; builds or reuses the binaries) and stops it at the end unless
  ``NEXUS_E2E_KEEP=1`` or it was already running before the run (then it is reused and
  left alone). With ``NEXUS_E2E_CLUSTER=existing`` it uses ``$KUBECONFIG``
  instead and never starts or stops anything. Yields a ``cluster.Cluster`` (or, for an
  existing cluster, an ``ExistingCluster``) with ``.kubeconfig``, ``.kubectl(...)`` and
  ``.log_tail(component)``. Namespaces left by ``make demo`` (``nexus-demo-*``) are removed
  first on a cluster of its own: they hold GPUs the tests count on.
- ``kube_api`` (session): a ``kubernetes.client.ApiClient`` for that cluster.
- ``core_v1``, ``batch_v1``, ``custom_objects`` (session): typed API objects on it.
- ``e2e_namespace`` (function): a fresh namespace for the test (``e2e-<test>-<random>``)
  with LocalQueues ``gold``, ``silver`` and ``bronze`` pointing at the ClusterQueues of the
  same name; yields the namespace name and deletes it afterwards.

Two planes (``NEXUS_E2E_KUBERNETES``, see cluster.py): ``make test`` runs the whole suite on
the newest Kubernetes, then the tests marked ``gate_webhook`` or ``oldest_kubernetes`` on the
oldest the README promises, where the chart's ``gateMode: auto`` renders the webhook (no
MutatingAdmissionPolicy served). ``gate_webhook`` modules run the controller in that mode
and run on the oldest plane only; ``oldest_kubernetes`` tests run on both.

On an e2e test failure the tail of every component log, and the pods/workloads/events of
the test namespace, are attached to the pytest report.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

E2E_DIR = Path(__file__).resolve().parent
if str(E2E_DIR) not in sys.path:
    sys.path.insert(0, str(E2E_DIR))

import cluster as cluster_mod  # noqa: E402
from builders import create_local_queue  # noqa: E402
from e2e_util import AUTO_GATE_MODE, wait_for  # noqa: E402

TIERS = ("gold", "silver", "bronze")
_active: dict[str, Any] = {}


class ExistingCluster:
    """An already running cluster reached through $KUBECONFIG (NEXUS_E2E_CLUSTER=existing)."""

    started_here = False

    def __init__(self, kubeconfig: str):
        self.kubeconfig = Path(kubeconfig)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess:
        r = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            text=True,
            capture_output=True,
            timeout=timeout,
        )
        if check and r.returncode != 0:
            raise RuntimeError(r.stderr)
        return r

    def apply(self, docs: Any, retries: int = 1, delay: float = 1.0) -> None:
        import yaml

        text = docs if isinstance(docs, str) else yaml.safe_dump_all(docs, sort_keys=False)
        self.kubectl("apply", "--server-side", "--field-manager=nexus-e2e", "-f", "-", input=text)

    def log_tail(self, name: str, lines: int = 40) -> str:
        return ""


@pytest.fixture(scope="session")
def e2e_cluster() -> Iterator[Any]:
    if os.environ.get("NEXUS_E2E_CLUSTER") == "existing":
        kc = os.environ.get("KUBECONFIG")
        if not kc:
            pytest.fail("NEXUS_E2E_CLUSTER=existing needs KUBECONFIG")
        c: Any = ExistingCluster(kc.split(os.pathsep)[0])
        _active["cluster"] = c
        yield c
        return
    c = cluster_mod.Cluster()
    try:
        c.up()
    except cluster_mod.ClusterError as e:
        pytest.fail(f"could not bring up the e2e control plane: {e}", pytrace=False)
    _active["cluster"] = c
    # `make demo` leaves its samples running on the cluster it brings up; their GPUs would
    # be missing from the tests that count on the whole fleet
    import demo

    left = demo.remove_earlier_demos(c)
    if left:
        cluster_mod.log(f"removed the namespaces of earlier `make demo` runs: {', '.join(left)}")
    yield c
    _active.pop("cluster", None)
    if os.environ.get("NEXUS_E2E_KEEP") == "1":
        cluster_mod.log(f"NEXUS_E2E_KEEP=1: leaving the cluster up (KUBECONFIG={c.kubeconfig})")
    elif not c.started_here:
        cluster_mod.log("the cluster was already up before this run: leaving it up")
    else:
        c.down(keep_logs=True)


@pytest.fixture(scope="session")
def kube_api(e2e_cluster: Any):
    from kubernetes import config

    api = config.new_client_from_config(config_file=str(e2e_cluster.kubeconfig))
    yield api
    api.close()


@pytest.fixture(scope="session")
def core_v1(kube_api):
    from kubernetes import client

    return client.CoreV1Api(kube_api)


@pytest.fixture(scope="session")
def batch_v1(kube_api):
    from kubernetes import client

    return client.BatchV1Api(kube_api)


@pytest.fixture(scope="session")
def custom_objects(kube_api):
    from kubernetes import client

    return client.CustomObjectsApi(kube_api)


@pytest.fixture
def e2e_namespace(request, core_v1, custom_objects) -> Iterator[str]:
    from kubernetes import client

    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"e2e-{base}-{uuid.uuid4().hex[:5]}"
    core_v1.create_namespace(
        client.V1Namespace(
            metadata=client.V1ObjectMeta(name=name, labels={"scheduling.kubenexus.io/e2e": "true"})
        )
    )
    _active["namespace"] = name
    # pods cannot be created before the controller-manager made the default ServiceAccount
    wait_for(
        f"default ServiceAccount in {name}",
        lambda: core_v1.read_namespaced_service_account("default", name),
        timeout=60,
    )
    for tier in TIERS:
        create_local_queue(custom_objects, name, tier, tier)
    yield name
    _active.pop("namespace", None)
    with contextlib.suppress(client.ApiException):
        core_v1.delete_namespace(name, propagation_policy="Background")


@pytest.fixture(scope="module")
def gate_mode() -> str:
    """Who gates pods (`NexusController(gate_mode=...)`, the chart's `webhook.gateMode`):
    what `auto` picks on this plane. The `gate_webhook` modules override it with "webhook"
    (e2e/tests/test_gate_webhook.py)."""
    return AUTO_GATE_MODE


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The webhook gate mode is the path `auto` takes on the oldest plane: its modules run
    there (the second half of `make test`), not on the newest, where the policies gate."""
    if cluster_mod.kubernetes_line() == "oldest":
        return
    skip = pytest.mark.skip(
        reason="webhook gate mode: runs on the oldest Kubernetes plane "
        "(NEXUS_E2E_KUBERNETES=oldest pytest -m 'gate_webhook or oldest_kubernetes' e2e/tests, "
        "the second half of make test)"
    )
    for item in items:
        if item.get_closest_marker("gate_webhook"):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def pin_at_creation() -> bool:
    """Whether pods are pinned at creation (the chart's `webhook.pinAtCreation`: the pin
    hook in policy mode, the gate hook at /pod-gate-pin in webhook mode): on, as the chart
    ships, unless NEXUS_E2E_PIN_AT_CREATION=0. `test_faults.py` turns it off: its ungating
    faults need the Job controller's pods gated."""
    return os.environ.get("NEXUS_E2E_PIN_AT_CREATION", "1") != "0"


@pytest.fixture(scope="module")
def nexus_controller(e2e_cluster: Any, gate_mode: str, pin_at_creation: bool) -> Iterator[Any]:
    """nexus-admit installed (CRDs, PlacementConfig, AdmissionCheck, nexus ClusterQueues,
    pod webhook, gate policies in `gate_mode` policy) and running against the control
    plane; stopped after the module, so the tests that stand in for the controller
    (test_plan_live) run without it."""
    from nexus_controller import NexusController

    nc = NexusController(e2e_cluster, gate_mode=gate_mode, pin_at_creation=pin_at_creation)
    nc.install()
    try:
        nc.start()
    except cluster_mod.ClusterError as e:
        nc.stop()
        nc.uninstall_webhook()  # it fails closed: never leave it pointing at nothing
        pytest.fail(f"could not start nexus-admit: {e}", pytrace=False)
    _active["controller"] = nc
    yield nc
    _active.pop("controller", None)
    nc.stop()
    nc.uninstall_webhook()


@pytest.fixture
def nexus_namespace(e2e_namespace: str, nexus_controller: Any, custom_objects) -> str:
    """A test namespace whose LocalQueues nexus-gold/-silver/-bronze feed the nexus-checked
    ClusterQueues of the same names."""
    for tier in TIERS:
        create_local_queue(custom_objects, e2e_namespace, f"nexus-{tier}", f"nexus-{tier}")
    return e2e_namespace


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed or "e2e_cluster" not in getattr(item, "fixturenames", ()):
        return
    c = _active.get("cluster")
    if c is None:
        return
    sections = []
    for name in cluster_mod.COMPONENTS:
        tail = c.log_tail(name, 30)
        if tail:
            sections.append(f"----- {name} (last 30 lines)\n{tail}")
    nc = _active.get("controller")
    if nc is not None:
        sections.append(f"----- nexus-admit (last 60 lines)\n{nc.log_tail(60)}")
    ns = _active.get("namespace")
    if ns:
        for args in (
            ("get", "pods,jobs,workloads.kueue.x-k8s.io", "-n", ns, "-o", "wide"),
            ("get", "events", "-n", ns, "--sort-by=.lastTimestamp"),
        ):
            try:
                r = c.kubectl(*args, check=False, timeout=20)
                sections.append(f"----- kubectl {' '.join(args)}\n{r.stdout}{r.stderr}")
            except Exception as e:
                sections.append(f"----- kubectl {' '.join(args)} failed: {e}")
    if sections:
        report.sections.append(("e2e control plane", "\n".join(sections)))
