"""Issue 28 item 6 on the real control plane: a write held past the lease never lands.

The leader sends a ResourceReservation create; the apiserver holds it (a slow admission
webhook, as a busy policy engine or a slow etcd would); the leader hangs (SIGSTOP, as a
long GC pause or a frozen VM does) and cannot renew; the Workload is deleted, another
replica takes the Lease; then the held request is let go. A write of a replica that no
longer leads must not land: here it stores a reservation of a deleted Workload, holding
8 GPUs the new leader never promised until the garbage collector deletes it (a moment
here; for good, had the Workload been retried rather than deleted).

Before: the client gave up after `lease - renew deadline` seconds, but only on its side;
the apiserver kept the request and stored the reservation when the webhook answered.
Now every guarded write carries the same bound as the request's `timeout`, which the
apiserver applies to its own handling (admission included), so it is refused there.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import ssl
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import demo
import pytest
from builders import create_local_queue
from e2e_util import KUEUE_GROUP, KUEUE_VERSION, wait_for
from kubernetes import client, watch
from nexus_controller import NexusController
from test_controller import RR_GROUP, RR_PLURAL, RR_VERSION, job, wait_check
from test_leader import LEASE_NS, lease_holder

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

# short, so the handover fits well inside the webhook's 30 s: writes are bounded to 2 s
LEASE = ("--lease-seconds=6", "--renew-deadline-seconds=4", "--lease-retry-seconds=1")
HOLD_WEBHOOK = "nexus-e2e-hold-reservations"


class HoldingWebhook:
    """A validating webhook on ResourceReservation creates that holds the first request
    until `release` is set, then allows it; every other request is allowed at once."""

    def __init__(self, cert: str, key: str):
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.held: dict[str, Any] = {}
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                if not webhook.held:
                    webhook.held = request
                    webhook.arrived.set()
                    webhook.release.wait(60)
                answer = {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {"uid": request["uid"], "allowed": True},
                }
                data = json.dumps(answer).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the apiserver gave up on this call
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


def holding_configuration(port: int, ca: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": HOLD_WEBHOOK},
        "webhooks": [
            {
                "name": "hold.e2e.kubenexus.io",
                "clientConfig": {"url": f"https://127.0.0.1:{port}/hold", "caBundle": ca},
                "rules": [
                    {
                        "apiGroups": [RR_GROUP],
                        "apiVersions": [RR_VERSION],
                        "operations": ["CREATE"],
                        "resources": [RR_PLURAL],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": namespace}
                },
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 30,
            }
        ],
    }


@pytest.fixture
def fenced(
    e2e_cluster: Any, e2e_namespace: str, custom_objects: client.CustomObjectsApi
) -> Iterator[tuple[NexusController, NexusController, str, HoldingWebhook, str]]:
    """Replica `a` leading, `b` not started; the nexus-* LocalQueues in the namespace; the
    holding webhook registered for its reservations."""
    lease = f"nexus-admit-fence-{uuid.uuid4().hex[:5]}"
    args = ["--leader-elect", f"--lease-namespace={LEASE_NS}", f"--lease-name={lease}", *LEASE]
    a = NexusController(e2e_cluster, name="nexus-admit-fence-a", extra_args=args)
    b = NexusController(e2e_cluster, name="nexus-admit-fence-b", extra_args=args)
    b.install()
    for tier in ("gold", "silver", "bronze"):
        create_local_queue(custom_objects, e2e_namespace, f"nexus-{tier}", f"nexus-{tier}")
    crt, key = b.ensure_cert()
    hook = HoldingWebhook(str(crt), str(key))
    ca = (e2e_cluster.pki / "ca.crt").read_bytes()
    e2e_cluster.apply([holding_configuration(hook.port, base64.b64encode(ca).decode(),
                                             e2e_namespace)])
    try:
        a.start()
        wait_for("a leads", lambda: lease_holder(custom_objects, lease).endswith(
            f"_{a.proc.pid}"), timeout=30)
        yield a, b, lease, hook, e2e_namespace
    finally:
        if a.proc is not None and a.proc.poll() is None:
            os.kill(a.proc.pid, signal.SIGCONT)
        for nc in (a, b):
            nc.stop()
        hook.close()
        e2e_cluster.kubectl("delete", "validatingwebhookconfiguration", HOLD_WEBHOOK,
                            "--ignore-not-found")
        b.uninstall_webhook()
        e2e_cluster.kubectl("delete", "lease", lease, "-n", LEASE_NS, "--ignore-not-found")
        demo.remove_namespace(e2e_cluster, e2e_namespace)


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_reservation_create_held_past_the_lease_never_lands(
    fenced, e2e_cluster, batch_v1, custom_objects
):
    if not hasattr(e2e_cluster, "logs_dir"):
        pytest.skip("reads the apiserver's log: a plane of its own only")
    a, b, lease, hook, ns = fenced
    batch_v1.create_namespaced_job(ns, job("stale", "nexus-gold", pods=1, gpus=8))
    assert hook.arrived.wait(90), "the leader never sent the reservation create"
    held_name = hook.held["object"]["metadata"]["name"]
    os.kill(a.proc.pid, signal.SIGSTOP)  # the leader hangs with its create in flight
    wait_for("a stopped", lambda: _stopped(a.proc.pid), timeout=10)

    # the world moves on: the Workload goes, another replica leads
    batch_v1.delete_namespaced_job("stale", ns, propagation_policy="Background")
    wait_for(
        "the Workload deleted",
        lambda: not custom_objects.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, ns, "workloads")["items"],
        timeout=60,
    )
    b.start()
    wait_for("b leads", lambda: lease_holder(custom_objects, lease).endswith(
        f"_{b.proc.pid}"), timeout=60)

    # every reservation stored in the namespace from now on: the garbage collector deletes
    # one whose Workload is gone within moments, so a poll could miss it
    # (watched from the version of this list: nothing is missed however late it connects)
    stored: list[str] = []
    rr_watch = watch.Watch()
    now = custom_objects.list_namespaced_custom_object(RR_GROUP, RR_VERSION, ns, RR_PLURAL)
    assert not now["items"], "nothing stored while the create is held"

    watch_failed: list[BaseException] = []

    def record() -> None:
        try:
            for event in rr_watch.stream(
                custom_objects.list_namespaced_custom_object,
                RR_GROUP, RR_VERSION, ns, RR_PLURAL, timeout_seconds=120,
                resource_version=now["metadata"]["resourceVersion"],
            ):
                if event["type"] == "ADDED":
                    stored.append(event["object"]["metadata"]["name"])
        except Exception as e:  # noticed below while it matters; later, the namespace goes
            watch_failed.append(e)

    threading.Thread(target=record, daemon=True).start()

    def outcome() -> str | None:
        """`landed` once the reservation is stored; `refused` once the apiserver gave up
        on the held request (its own log: the webhook call ran past the request's
        deadline; a hung-up client shows as "context canceled" instead). Replica a's log
        is no signal: resumed, it may cancel its pass (it no longer leads) before it
        reads the create's answer."""
        if held_name in stored:
            return "landed"
        hold_url = f"127.0.0.1:{hook.port}/hold"
        for line in e2e_cluster.log_tail("kube-apiserver", 2000).splitlines():
            if hold_url in line and "context deadline exceeded" in line:
                return "refused"
        return None

    # the apiserver gets its answer, allowed, while a still hangs on the connection (were a
    # to resume first, it would time out and hang up, and the apiserver drop the request)
    hook.release.set()
    answered = wait_for("the held create answered", outcome, timeout=60)
    os.kill(a.proc.pid, signal.SIGCONT)
    assert answered == "refused", (
        f"reservation {held_name} was stored after replica a lost the Lease:\n{a.log_tail(20)}")
    wait_for("a stopped leading", lambda: "stopped leading" in a.log_tail(50), timeout=30)
    assert not custom_objects.list_namespaced_custom_object(
        RR_GROUP, RR_VERSION, ns, RR_PLURAL)["items"]
    assert not stored, stored
    assert not watch_failed, watch_failed
    rr_watch.stop()

    # the bound leaves the new leader's ordinary writes alone
    batch_v1.create_namespaced_job(ns, job("fresh", "nexus-gold", pods=1, gpus=8))
    wait_check(custom_objects, ns, "fresh", ("Ready",), timeout=90)
