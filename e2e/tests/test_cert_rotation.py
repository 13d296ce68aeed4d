"""The webhook's serving certificate replaced under the running controller (as cert-manager
or a new Secret would: new key, new serial, the files swapped): the same process serves the
new certificate to new TLS handshakes, and the apiserver's webhook calls go on succeeding
(a Job's pods are created through the webhook, gated, placed and Running)."""

from __future__ import annotations

import socket
import ssl
import time
from typing import Any

import pytest
from cryptography import x509
from e2e_util import wait_for
from test_controller import GATE, job, running

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]


def served_serial(nc: Any) -> int:
    """The serial of the certificate the webhook presents to a new TLS handshake."""
    tls = ssl.create_default_context(cafile=str(nc.cluster.pki / "ca.crt"))
    with (
        socket.create_connection(("127.0.0.1", nc.webhook_port), timeout=5) as sock,
        tls.wrap_socket(sock, server_hostname="127.0.0.1") as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


def test_a_rotated_certificate_is_served_without_a_restart(
    nexus_namespace: str, nexus_controller: Any, core_v1: Any, batch_v1: Any
) -> None:
    nc = nexus_controller
    pid = nc.proc.pid
    before = served_serial(nc)
    reloads_before = nc.metrics().count("nexus_admit_webhook_certificate_reloads_total 0.0")

    crt, _ = nc.issue_cert()
    t0 = time.monotonic()
    after = x509.load_pem_x509_certificate(crt.read_bytes()).serial_number
    assert after != before
    wait_for(
        "the webhook serves the new certificate",
        lambda: served_serial(nc) == after,
        timeout=30,  # checked every 10 s by default
    )
    took = time.monotonic() - t0
    assert nc.proc.poll() is None and nc.proc.pid == pid, "no restart"
    assert reloads_before == 1
    assert "nexus_admit_webhook_certificate_reloads_total 1.0" in nc.metrics()

    # the apiserver still reaches the webhook: pods are created (gated by it) and placed
    batch_v1.create_namespaced_job(nexus_namespace, job("rotated", "nexus-bronze", pods=2, gpus=1))
    pods = wait_for(
        "rotated: 2 pods Running",
        lambda: running(core_v1, nexus_namespace, "rotated", 2),
        timeout=90,
    )
    assert all(GATE not in [g.name for g in p.spec.scheduling_gates or []] for p in pods)
    assert all(p.metadata.annotations.get("scheduling.kubenexus.io/slot") for p in pods)
    assert "webhook certificate reloaded" in nc.log_tail(200)
    print(f"\n[cert] new certificate served {took:.1f}s after the files changed; pid {pid} kept")
