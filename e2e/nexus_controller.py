"""nexus-admit's controller on the local control plane: its CRDs, its Kueue objects, its
webhook registration, and the `nexus-admit run` process itself.

    python3 e2e/nexus_controller.py run     # cluster up, install, run in the foreground
                                            # (what `make run` does)

The e2e fixture `nexus_controller` uses the same `NexusController`. On the local control
plane the webhook listens on 127.0.0.1 with a certificate signed by the cluster's CA, and
the MutatingWebhookConfiguration points at it by URL, the way `cluster.py` registers Kueue's
own webhooks. The chart does the same with a Service instead of a URL.

Two gate modes, as the chart's `webhook.gateMode` (tests/charts checks the hooks match):
"policy" (what `auto` picks on this 1.36 plane) gates pods in the apiserver with the
MutatingAdmissionPolicies and sends only reservation-labelled pods of untrusted creators to
the webhook; "webhook" (what `auto` picks on a cluster before 1.36, which serves no
MutatingAdmissionPolicy) installs no policy and sends every reservation-labelled pod, every
queue-labelled pod and every pod Kueue suspends through a StatefulSet to the webhook.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

E2E_DIR = Path(__file__).resolve().parent
if str(E2E_DIR) not in sys.path:
    sys.path.insert(0, str(E2E_DIR))

import cluster as cluster_mod  # noqa: E402
import nexus_webhooks  # noqa: E402
from nexus_webhooks import (  # noqa: E402
    QUEUE_LABEL,
    RESERVATION_LABEL,
    SYSTEM_NAMESPACES_EXCLUDED,
)

from nexus_admit.kube.labels import GATE_PLACEMENT as GATE  # noqa: E402
from nexus_admit.kube.pod_gate_policy import (  # noqa: E402
    TRUSTED_POD_CREATORS,
    pod_gate_binding,
    pod_gate_policy,
    queue_gate_binding,
    queue_gate_policy,
)

REPO = E2E_DIR.parent
MANIFEST = E2E_DIR / "manifests" / "nexus.yaml"
CHECK_NAME = "nexus-placement"
TIER_QUEUES = ("nexus-gold", "nexus-silver", "nexus-bronze")
WEBHOOK_CONFIG = "nexus-admit"
POD_GATE_POLICY = "nexus-admit-pod-gate"
QUEUE_GATE_POLICY = "nexus-admit-queue-gate"
# the ConfigMap the queue gate policy reads; the controller keeps it (controller/queue_gate.py)
GATED_QUEUES_NAMESPACE = "default"
GATED_QUEUES_CONFIGMAP = "nexus-admit-gated-queues"
# the process environment the image and the chart give the controller
PROCESS_ENV = {"PYTHONUNBUFFERED": "1", "MALLOC_ARENA_MAX": "2"}
GATE_MODES = ("policy", "webhook")

def _nexus_admit_exe() -> str:
    exe = Path(sys.executable).parent / "nexus-admit"
    return str(exe) if exe.exists() else "nexus-admit"


class NexusController:
    """One `nexus-admit run` process. Several can run side by side (e.g. two replicas with
    leader election): give each its own `name` (its log file) and `extra_args`; each gets
    its own webhook and health ports."""

    def __init__(
        self,
        cluster: Any,
        name: str = "nexus-admit",
        extra_args: Sequence[str] = (),
        gate_mode: str = "policy",
        pin_at_creation: bool = True,
    ):
        if gate_mode not in GATE_MODES:
            raise ValueError(f"gate_mode must be one of {GATE_MODES}, not {gate_mode!r}")
        self.cluster = cluster
        self.gate_mode = gate_mode
        # the chart's webhook.pinAtCreation: the pin hook registered (policy mode), or the
        # gate hook answering at /pod-gate-pin (webhook mode)
        self.pin_at_creation = pin_at_creation
        self.name = name
        self.extra_args = list(extra_args)
        self.webhook_config_name = WEBHOOK_CONFIG
        self.policy_name = POD_GATE_POLICY
        self.proc: subprocess.Popen | None = None
        self.webhook_port = cluster_mod.free_port()
        self.health_port = cluster_mod.free_port()
        self.log_file = cluster.state / "logs" / f"{name}.log"
        # serve /healthz, /readyz, /metrics over TLS with the webhook's certificate, as the
        # chart's metrics.tls does
        self.metrics_tls = False

    # -- certificate ------------------------------------------------------------------
    def ensure_cert(self) -> tuple[Path, Path]:
        """A serving certificate for 127.0.0.1 signed by the cluster's CA (made once)."""
        pki = self.cluster.pki
        crt, key = pki / "nexus-webhook.crt", pki / "nexus-webhook.key"
        if crt.exists() and key.exists():
            return crt, key
        return self.issue_cert()

    def issue_cert(self) -> tuple[Path, Path]:
        """A new serving certificate (new key, new serial) in place of the current one, as
        a renewal would write it: each file replaced whole (rename), the key first."""
        pki = self.cluster.pki
        crt, key = pki / "nexus-webhook.crt", pki / "nexus-webhook.key"
        x509, hashes, serialization, ec, eku, name_oid = cluster_mod._pki()
        ca_cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
        ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
        leaf_key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, "nexus-admit")]))
            .issuer_name(ca_cert.subject)
            .public_key(leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([eku.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        for path, data in (
            (key, cluster_mod._key_pem(leaf_key)),
            (crt, cert.public_bytes(serialization.Encoding.PEM)),
        ):
            tmp = path.with_suffix(path.suffix + ".new")
            tmp.write_bytes(data)
            tmp.chmod(0o600)
            os.replace(tmp, path)
        return crt, key

    # -- objects ------------------------------------------------------------------------
    def webhook_configuration(self) -> dict[str, Any]:
        """The hooks of the chart's MutatingWebhookConfiguration in this gate mode
        (charts/nexus-admit/templates/webhook.yaml), by URL (nexus_webhooks.py)."""
        return nexus_webhooks.webhook_configuration(
            self.webhook_config_name,
            self.gate_mode,
            self.pin_at_creation,
            self.webhook_port,
            (self.cluster.pki / "ca.crt").read_bytes(),
        )

    def install(self) -> None:
        """CRDs, the PlacementConfig, AdmissionCheck, flavor and ClusterQueues, the webhook."""
        crds = [
            d
            for f in sorted((REPO / "crds").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text())
            if d
        ]
        self.cluster.apply(crds)
        self.cluster.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/resourcereservations.scheduling.kubenexus.io",
            "crd/placementconfigs.scheduling.kubenexus.io",
        )
        self.cluster.apply(MANIFEST.read_text(), retries=10)
        self.register_admission()

    def admission_objects(self) -> list[dict[str, Any]]:
        """The policy that gates the Job controller's pods, the one that gates pods of
        queues that use our check (with the ConfigMap it reads, which the controller fills),
        their bindings, and the webhook; in webhook gate mode the webhook alone."""
        if self.gate_mode == "webhook":
            return [self.webhook_configuration()]
        return [
            pod_gate_policy(self.policy_name, pin_at_creation=self.pin_at_creation),
            pod_gate_binding(self.policy_name, SYSTEM_NAMESPACES_EXCLUDED),
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": GATED_QUEUES_CONFIGMAP, "namespace": GATED_QUEUES_NAMESPACE},
            },
            queue_gate_policy(QUEUE_GATE_POLICY),
            queue_gate_binding(
                QUEUE_GATE_POLICY,
                SYSTEM_NAMESPACES_EXCLUDED,
                GATED_QUEUES_NAMESPACE,
                GATED_QUEUES_CONFIGMAP,
            ),
            self.webhook_configuration(),
        ]

    def register_admission(self) -> None:
        if self.gate_mode == "webhook":
            # a policy left by a policy-mode run would gate the pods this mode must gate
            self.uninstall_webhook()
        self.cluster.apply(self.admission_objects())
        if self.gate_mode == "policy":
            self._wait_pod_gate_policy()

    def uninstall_webhook(self) -> None:
        """Without the controller its webhook would refuse every pod it selects (it fails
        closed), so it goes when the controller goes, and the gating policy with it."""
        for kind, name in (
            ("mutatingwebhookconfiguration", self.webhook_config_name),
            ("mutatingadmissionpolicybinding", self.policy_name),
            ("mutatingadmissionpolicy", self.policy_name),
            ("mutatingadmissionpolicybinding", QUEUE_GATE_POLICY),
            ("mutatingadmissionpolicy", QUEUE_GATE_POLICY),
        ):
            self.cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        self._wait_gating_gone()

    def _dry_run_pod(self, labels: dict[str, str]) -> tuple[int, list[dict[str, Any]], str]:
        """Create a labelled pod as the Job controller, server-side dry run: the exit code,
        the scheduling gates the admission chain gave it, and kubectl's error output."""
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "pod-gate-probe-", "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "probe"}]},
        }
        r = self.cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-n", "default",
            f"--as={TRUSTED_POD_CREATORS[0]}", "-f", "-",
            input=json.dumps(probe), check=False,
        )
        gates = json.loads(r.stdout or "{}").get("spec", {}).get("schedulingGates") or []
        return r.returncode, gates, r.stderr.strip()

    def _wait_gating_gone(self, timeout: float = 30.0) -> None:
        """The apiserver keeps applying a deleted policy (and calling a deleted webhook) for
        a moment: wait until a pod of a queue the gate list never named is admitted ungated,
        so the next test's new queues are not gated with no controller left to ungate them
        (a LeaderWorkerSet's leader stayed gated that way after a module's teardown)."""
        deadline = time.monotonic() + timeout
        while True:
            code, gates, err = self._dry_run_pod({QUEUE_LABEL: "teardown-probe-unlisted"})
            if code == 0 and not any(g.get("name") == GATE for g in gates):
                return
            if time.monotonic() > deadline:
                print(f"[nexus_controller] gating still applied {timeout:.0f} s after its "
                      f"removal: {err or gates}")
                return
            time.sleep(0.3)

    def _wait_pod_gate_policy(self, timeout: float = 30.0) -> None:
        """The apiserver applies a new policy a moment after it is created: wait until a
        server-side dry run of a labelled pod, created as the Job controller (which the
        webhook skips), comes back gated."""
        deadline = time.monotonic() + timeout
        while True:
            code, gates, err = self._dry_run_pod({RESERVATION_LABEL: "probe"})
            if code == 0 and any(g.get("name") == GATE for g in gates):
                return
            if time.monotonic() > deadline:
                raise cluster_mod.ClusterError(
                    f"the pod gate policy did not gate a dry-run pod within {timeout:.0f} s: "
                    f"{err or gates}"
                )
            time.sleep(0.3)

    # -- process ------------------------------------------------------------------------
    def argv(self) -> list[str]:
        crt, key = self.ensure_cert()
        return [
            _nexus_admit_exe(),
            "run",
            f"--kubeconfig={self.cluster.kubeconfig}",
            "--webhook-addr=127.0.0.1",
            f"--webhook-port={self.webhook_port}",
            f"--webhook-cert={crt}",
            f"--webhook-key={key}",
            "--health-addr=127.0.0.1",
            f"--health-port={self.health_port}",
            *([f"--metrics-cert={crt}", f"--metrics-key={key}"] if self.metrics_tls else []),
            "--retry-seconds=5",
            # the queue list only the queue gate policy reads (the chart passes it only then)
            *(
                [f"--queue-gate-configmap={GATED_QUEUES_NAMESPACE}/{GATED_QUEUES_CONFIGMAP}"]
                if self.gate_mode == "policy"
                else []
            ),
            *self.extra_args,
        ]

    def start(self, env: dict[str, str] | None = None, wait: bool = True) -> None:
        """Run the controller; `env` adds variables (e.g. the test-only NEXUS_FAULT).
        `wait=False` returns at once: a process set to die at its first write may be gone
        before it ever answers /readyz."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            out.write(f"\n==== {time.strftime('%F %T')} nexus-admit run\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **PROCESS_ENV, **(env or {})},
            )
        if wait:
            self.wait_ready()

    def health_url(self, path: str) -> str:
        return f"{'https' if self.metrics_tls else 'http'}://127.0.0.1:{self.health_port}{path}"

    def health_tls(self) -> ssl.SSLContext | None:
        """Trusts the cluster's CA, which signed the certificate (SAN 127.0.0.1)."""
        if not self.metrics_tls:
            return None
        return ssl.create_default_context(cafile=str(self.cluster.pki / "ca.crt"))

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                self.health_url("/readyz"), timeout=2, context=self.health_tls()
            ) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise cluster_mod.ClusterError(
                    f"nexus-admit exited ({self.proc.returncode}):\n{self.log_tail(40)}"
                )
            if self.ready() and self.check_active() and self.webhook_gates():
                return
            time.sleep(0.3)
        raise cluster_mod.ClusterError(
            f"nexus-admit not ready after {timeout}s:\n{self.log_tail(40)}"
        )

    def webhook_gates(self) -> bool:
        """In webhook gate mode nothing else gates a pod: the apiserver must be calling this
        process's webhook before a test creates one. A server-side dry run of a pod naming
        a reservation that does not exist is denied by our webhook, and by nothing else."""
        if self.gate_mode != "webhook":
            return True
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": "webhook-probe-",
                "labels": {RESERVATION_LABEL: "webhook-probe-absent"},
            },
            "spec": {"containers": [{"name": "c", "image": "probe"}]},
        }
        r = self.cluster.kubectl(
            "create",
            "--dry-run=server",
            "-n",
            "default",
            "-f",
            "-",
            input=json.dumps(probe),
            check=False,
        )
        return r.returncode != 0 and "ResourceReservation default/webhook-probe-absent" in r.stderr

    def check_active(self) -> bool:
        r = self.cluster.kubectl(
            "get", "admissionchecks.kueue.x-k8s.io", CHECK_NAME, "-o", "json", check=False
        )
        if r.returncode != 0:
            return False
        conds = json.loads(r.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Active" and c["status"] == "True" for c in conds)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def metrics(self) -> str:
        url, tls = self.health_url("/metrics"), self.health_tls()
        with urllib.request.urlopen(url, timeout=5, context=tls) as r:
            return r.read().decode()

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["run"]:
        print("usage: e2e/nexus_controller.py run", file=sys.stderr)
        return 2
    c = cluster_mod.Cluster()
    c.up()
    nc = NexusController(c)
    nc.install()
    print(f"export KUBECONFIG={c.kubeconfig}\n$ {' '.join(nc.argv())}", flush=True)
    proc = subprocess.Popen(nc.argv(), env={**os.environ, **PROCESS_ENV})
    try:
        return proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the controller too (same process group)
        return proc.wait(30)
    finally:
        # the webhook fails closed: it must not outlive the controller it points at
        nc.uninstall_webhook()


if __name__ == "__main__":
    sys.exit(main())
