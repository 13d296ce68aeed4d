"""The plane's PKI: one CA, the apiserver's serving certificate, client certificates, a
serving certificate per webhook server (Kueue, the workload controllers) and the
service-account keys; admin kubeconfigs from them."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import shutil
from pathlib import Path
from typing import Any

import yaml
from plane.processes import ClusterError


def _pki():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _key_pem(key) -> bytes:
    _, _, serialization, _, _, _ = _pki()
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _validity() -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    return now, now + dt.timedelta(days=30)


def _ca() -> tuple[Any, Any]:
    """A self-signed ECDSA CA: (certificate, key)."""
    x509, hashes, _, ec, _, NameOID = _pki()
    now, until = _validity()
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nexus-e2e-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return ca, ca_key


def _leaf(
    ca: Any, ca_key: Any, cn: str, orgs: list[str], dns: list[str], ips: list[str], server: bool
) -> tuple[Any, Any]:
    """A certificate signed by the CA, for a server (SANs) or a client: (certificate, key)."""
    x509, hashes, _, ec, EKU, NameOID = _pki()
    now, until = _validity()
    ca_name = ca.subject
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    b = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(attrs))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.ExtendedKeyUsage([EKU.SERVER_AUTH if server else EKU.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if dns or ips:
        sans: list[Any] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return b.sign(ca_key, hashes.SHA256()), key


def generate_pki(pki: Path, service_cidr: str, webhook_servers: list[str]) -> None:
    """CA, apiserver serving cert, client certs, service-account keys and, for each name in
    `webhook_servers`, a serving certificate for 127.0.0.1 in <pki>/<name>-webhook/tls.*
    (the layout controller-runtime's webhook server reads)."""
    _, _, serialization, ec, _, _ = _pki()
    pki.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _ca()
    (pki / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (pki / "ca.key").write_bytes(_key_pem(ca_key))

    def leaf(
        name: str, cn: str, orgs: list[str], dns: list[str], ips: list[str], server: bool
    ) -> None:
        cert, key = _leaf(ca, ca_key, cn, orgs, dns, ips, server)
        (pki / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (pki / f"{name}.key").write_bytes(_key_pem(key))

    svc_ip = str(next(ipaddress.ip_network(service_cidr).hosts()))
    leaf(
        "apiserver",
        "kube-apiserver",
        [],
        [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        ["127.0.0.1", svc_ip],
        server=True,
    )
    leaf("admin", "kubernetes-admin", ["system:masters"], [], [], server=False)
    leaf("kube-controller-manager", "system:kube-controller-manager", [], [], [], server=False)
    leaf("kube-scheduler", "system:kube-scheduler", [], [], [], server=False)
    # aggregation layer (front proxy) identity, restricted by --requestheader-allowed-names
    leaf("front-proxy-client", "front-proxy-client", [], [], [], server=False)
    for server in webhook_servers:
        name = f"{server}-webhook"
        leaf(name, name, [], ["localhost"], ["127.0.0.1"], server=True)
        wh = pki / name
        wh.mkdir(exist_ok=True)
        shutil.copy(pki / f"{name}.crt", wh / "tls.crt")
        shutil.copy(pki / f"{name}.key", wh / "tls.key")

    sa = ec.generate_private_key(ec.SECP256R1())
    (pki / "sa.key").write_bytes(_key_pem(sa))
    (pki / "sa.pub").write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for p in pki.rglob("*.key"):
        p.chmod(0o600)


# Kueue (v0.19, cmd/kueue/main.go) always loads a metrics serving certificate from this fixed
# path when its internal cert management is off, even when the metrics server is disabled.
KUEUE_METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


def ensure_kueue_metrics_cert(pki: Path) -> None:
    """Put a (never served) certificate where Kueue insists on finding one."""
    d = KUEUE_METRICS_CERT_DIR
    if (d / "tls.crt").exists() and (d / "tls.key").exists():
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        for name in ("tls.key", "tls.crt"):  # atomic: other state dirs may start Kueue too
            tmp = d / f".{name}.{os.getpid()}"
            shutil.copy(pki / ("kueue-webhook" + Path(name).suffix), tmp)
            tmp.chmod(0o600)
            tmp.replace(d / name)
    except OSError as e:
        raise ClusterError(
            f"Kueue needs {d}/tls.crt and tls.key (any certificate; the metrics server is "
            f"off). Create them once as root, e.g. by running `e2e/cluster.py up` as root: {e}"
        ) from e


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    b64 = lambda p: base64.b64encode(p.read_bytes()).decode()  # noqa: E731
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "nexus-e2e",
                "cluster": {"server": server, "certificate-authority-data": b64(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": b64(pki / f"{user}.crt"),
                    "client-key-data": b64(pki / f"{user}.key"),
                },
            }
        ],
        "contexts": [{"name": "nexus-e2e", "context": {"cluster": "nexus-e2e", "user": user}}],
        "current-context": "nexus-e2e",
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    path.chmod(0o600)
