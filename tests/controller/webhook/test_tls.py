"""The webhook certificate reloaded in place, checked with real TLS handshakes against a
real listening socket (e2e/tests/test_cert_rotation.py does it through the apiserver)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nexus_admit.controller.webhook.tls import CertificateError, ServingCertificate


def issue(directory: Path, *, key_of: Path | None = None) -> int:
    """Write tls.crt / tls.key (a self-signed certificate for 127.0.0.1) and return its
    serial; `key_of` writes the key found there instead of the certificate's own."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nexus-admit")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    (directory / "tls.key").write_bytes(key_of.read_bytes() if key_of else pem)
    return cert.serial_number


async def served_serial(port: int) -> int:
    client = ssl.create_default_context()
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return x509.load_der_x509_certificate(der).serial_number


def test_a_new_pair_is_served_to_new_handshakes_and_a_broken_one_never(tmp_path: Path) -> None:
    first = issue(tmp_path)
    reloads: list[int] = []
    cert = ServingCertificate(
        str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), on_reload=lambda: reloads.append(1)
    )

    async def scenario() -> None:
        server = await asyncio.start_server(
            lambda r, w: w.close(), "127.0.0.1", 0, ssl=cert.context
        )
        port = server.sockets[0].getsockname()[1]
        assert await served_serial(port) == first
        assert not cert.reload_if_changed(), "nothing changed"

        second = issue(tmp_path)
        assert cert.reload_if_changed()
        assert await served_serial(port) == second, "the same socket serves the new pair"

        # a certificate whose key has not been written yet: refused, the current one stays
        (tmp_path / "old.key").write_bytes((tmp_path / "tls.key").read_bytes())
        issue(tmp_path, key_of=tmp_path / "old.key")
        assert not cert.reload_if_changed()
        assert await served_serial(port) == second
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())
    assert reloads == [1]


def test_an_unusable_pair_at_start_says_which_files(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    with pytest.raises(CertificateError, match=r"tls\.crt and .*tls\.key are not a PEM"):
        ServingCertificate(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    with pytest.raises(CertificateError, match="cannot read"):
        ServingCertificate(str(tmp_path / "missing.crt"), str(tmp_path / "tls.key"))
