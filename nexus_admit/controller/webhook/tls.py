"""The webhook's serving certificate, reloaded in place when its files change.

Who calls it: `operator.py` builds one `ServingCertificate`, hands its `context` to kopf's
WebhookServer, and runs `watch` as a background task; with `--metrics-cert` another one
serves the health/metrics port the same way. A renewed certificate (cert-manager
renewing it, or a new Secret from `helm upgrade`; the kubelet swaps the mounted files) is
loaded into the same `ssl.SSLContext` the listening socket uses: every TLS handshake after
that presents the new certificate, with no restart and no moment without a listener.

Why not kopf's own file check: on a change kopf closes its server and binds a new one, and
a webhook call that arrives in between fails, which the apiserver (failurePolicy Fail) turns
into a refused pod. Why copy the files first: the certificate and the key are two files and
change one after the other; the pair is read once, checked on a scratch context, and only a
matching pair reaches the live context (a context given a key that does not match its new
certificate would fail every handshake).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["CertificateError", "ServingCertificate", "fingerprint"]

log = logging.getLogger(__name__)


class CertificateError(ValueError):
    """The certificate and key files cannot serve TLS (unreadable, not PEM, not a pair)."""


def fingerprint(cert_pem: bytes) -> str:
    """SHA-256 of the first certificate's DER, as kubectl and openssl print it."""
    der = ssl.PEM_cert_to_DER_cert(cert_pem.decode("ascii", errors="replace"))
    return hashlib.sha256(der).hexdigest()[:16]


class ServingCertificate:
    def __init__(
        self,
        certfile: str,
        keyfile: str,
        *,
        on_reload: Callable[[], None] | None = None,
        serves: str = "webhook",
    ):
        self.certfile = certfile
        self.keyfile = keyfile
        self.serves = serves  # what the log lines name: "webhook", "metrics"
        self.on_reload = on_reload
        self.context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)
        self.digest = ""  # of the pair loaded now
        self.fingerprint = ""
        if not self.reload_if_changed(initial=True):  # pragma: no cover - raises instead
            raise CertificateError("no certificate loaded")

    def _read(self) -> tuple[bytes, bytes]:
        try:
            return Path(self.certfile).read_bytes(), Path(self.keyfile).read_bytes()
        except OSError as e:
            raise CertificateError(
                f"cannot read the {self.serves} certificate or key: {e}"
            ) from None

    def reload_if_changed(self, *, initial: bool = False) -> bool:
        """Load the files into the live context if their content changed and they form a
        pair; True when a new pair was loaded. At start a bad pair raises; later it is
        logged and the current certificate stays."""
        try:
            cert, key = self._read()
            digest = hashlib.sha256(cert + b"\0" + key).hexdigest()
            if digest == self.digest:
                return False
            with tempfile.TemporaryDirectory(prefix="nexus-tls-") as tmp:
                c, k = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
                c.write_bytes(cert)
                k.touch(mode=0o600)
                k.write_bytes(key)
                scratch = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                try:
                    scratch.load_cert_chain(c, k)
                except (ssl.SSLError, ValueError) as e:
                    raise CertificateError(
                        f"{self.certfile} and {self.keyfile} are not a PEM certificate and "
                        f"its private key: {e}"
                    ) from None
                self.context.load_cert_chain(c, k)
        except CertificateError as e:
            if initial:
                raise
            log.warning(
                "%s certificate not reloaded, still serving the current one: %s", self.serves, e
            )
            return False
        self.digest = digest
        self.fingerprint = fingerprint(cert)
        if not initial:
            log.info(
                "%s certificate reloaded: now serving sha256 %s", self.serves, self.fingerprint
            )
            if self.on_reload is not None:
                self.on_reload()
        return True

    async def watch(self, interval: float) -> None:
        """Check the files every `interval` seconds, for ever. On the event loop's own thread:
        the handshakes that read the context run there too, and an SSL context must not be
        changed by one thread while another uses it (the files are a few KiB)."""
        while True:
            await asyncio.sleep(interval)
            self.reload_if_changed()
