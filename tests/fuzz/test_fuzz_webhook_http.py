"""Fuzz: the pod webhook over HTTPS, served the way `nexus-admit run` serves it: the
`WebhookThread` that `controller/operator.py` builds (the guarded server in front of
`webhook.answer_review`, on a thread of its own). The server listens on 127.0.0.1 with a
throwaway certificate; no cluster is needed. The handler's store holds a reservation and its
Workload, so well-formed reviews reach every branch of the decision.

Bodies: bytes that are not JSON, JSON that is not an object, AdmissionReviews with fields
removed or replaced by junk at any depth (request, uid, kinds, the pod's labels,
annotations and scheduling gates), pods with odd labels and annotations. Every request
gets an HTTP answer and never a 500: a 400 that says why when there is no `request.uid`
to answer to, else an AdmissionReview carrying that uid, whose denials start with the
object ("Pod ns/name" or "AdmissionReview <uid>") and name the field. An allowed pod that
gets a patch gets exactly our gate added.

`NEXUS_FUZZ_EXAMPLES` sets the examples (default 300; `make fuzz` runs 10,000).
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import http.client
import ipaddress
import json
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from hypothesis import given
from hypothesis import strategies as st

from nexus_admit.controller.operator import WEBHOOK_PATH, webhook_thread
from nexus_admit.controller.options import RunOptions
from nexus_admit.kube import labels as L
from tests.fuzz.test_fuzz_inputs import FUZZ, JUNK, WEBHOOK_POD, _webhook_ctx, mutated

UID = "7f3c1a52-0000-4000-8000-000000000001"
REVIEW = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": UID,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "p",
        "namespace": "default",
        "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
        "object": WEBHOOK_POD,
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    },
}
ANSWERED = (200, 400, 404, 413)  # 404: a path that names no handler; 413: over 1 MiB


# ---------------------------------------------------------------- the server


def _throwaway_cert(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nexus-admit-fuzz")])
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    crt_file, key_file = directory / "tls.crt", directory / "tls.key"
    crt_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return crt_file, key_file


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Webhook:
    port: int
    tls: ssl.SSLContext
    conn: http.client.HTTPSConnection | None = None

    def post(self, body: bytes, path: str = WEBHOOK_PATH) -> tuple[int, bytes]:
        """One request on a kept-alive connection (a TLS handshake per example would be
        most of the test's time); a connection the server closed is opened again."""
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(
                    "127.0.0.1", self.port, context=self.tls, timeout=30
                )
            try:
                self.conn.request(
                    "POST", path, body=body, headers={"Content-Type": "application/json"}
                )
                r = self.conn.getresponse()
                payload = r.read()
            except (http.client.RemoteDisconnected, ConnectionError, BrokenPipeError):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
                continue
            if r.will_close:
                self.conn.close()
                self.conn = None
            return r.status, payload
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    crt, key = _throwaway_cert(tmp_path_factory.mktemp("tls"))
    options = RunOptions(
        webhook_addr="127.0.0.1",
        webhook_port=_free_port(),
        webhook_cert=str(crt),
        webhook_key=str(key),
    )
    server = webhook_thread(options, _webhook_ctx())
    server.start()
    hook = Webhook(options.webhook_port, ssl.create_default_context(cafile=str(crt)))
    yield hook
    if hook.conn is not None:
        hook.conn.close()  # else the server waits for the kept-alive connection to end
    server.stop()
    assert not server._thread.is_alive()


# ---------------------------------------------------------------- what an answer is


def assert_answered(sent: Any, status: int, payload: bytes) -> None:
    assert status in ANSWERED, f"HTTP {status} for {sent!r:.300}: {payload[:300]!r}"
    if status != 200:
        assert payload.strip(), f"HTTP {status} without a reason"
        return
    review = json.loads(payload)
    response = review["response"]
    assert response["uid"] == sent["request"]["uid"], response
    if not response["allowed"]:
        message = response["status"]["message"]
        assert response["status"]["code"] != 500, f"our handler crashed: {message}"
        assert message.startswith(("Pod ", "AdmissionReview ")), message
        assert any(f in message for f in ("field ", "spec.", "metadata.", "label")), message
    elif "patch" in response:
        pod = sent["request"]["object"]
        before = (pod.get("spec") or {}).get("schedulingGates") or []
        assert gates_after(pod, response) == [*before, OURS]


OURS = {"name": L.GATE_PLACEMENT}


def gates_after(pod: dict[str, Any], response: dict[str, Any]) -> list[Any]:
    """The pod's scheduling gates once the webhook's JSON patch is applied."""
    assert response["patchType"] == "JSONPatch"
    patch = jsonpatch.JsonPatch(json.loads(base64.b64decode(response["patch"])))
    return list(patch.apply(copy.deepcopy(pod))["spec"]["schedulingGates"])


def review_of(pod: Any) -> dict[str, Any]:
    review = copy.deepcopy(REVIEW)
    review["request"]["object"] = pod
    return review


# ---------------------------------------------------------------- fuzz

LABEL_TEXT = st.text(max_size=80) | st.sampled_from(["", "w-1", "x" * 64, "a/b", "ü\x00"])
ODD_POD = st.fixed_dictionaries(
    {
        "kind": st.just("Pod"),
        "metadata": st.fixed_dictionaries(
            {
                "name": LABEL_TEXT,
                "namespace": st.just("default"),
                "labels": st.dictionaries(LABEL_TEXT, LABEL_TEXT, max_size=4).map(
                    lambda d: {**d, L.LABEL_RESERVATION: "w-1"}
                ),
                "annotations": st.dictionaries(LABEL_TEXT, LABEL_TEXT | JUNK, max_size=4),
            }
        ),
        "spec": st.fixed_dictionaries(
            {"containers": st.just([{"name": "c"}]), "schedulingGates": JUNK}
        ),
    }
)
BODIES = st.one_of(
    st.binary(max_size=300).map(lambda b: ("bytes", b)),
    JUNK.map(lambda j: ("json", j)),
    mutated(REVIEW, keep=()).map(lambda r: ("review", r)),
    ODD_POD.map(lambda p: ("review", review_of(p))),
)


@FUZZ
@given(BODIES)
def test_every_request_gets_an_answer_and_a_denial_says_why(
    webhook: Webhook, body: tuple[str, Any]
) -> None:
    shape, value = body
    raw = value if shape == "bytes" else json.dumps(value).encode()
    status, payload = webhook.post(raw)
    if shape == "review" and status == 200:
        assert_answered(value, status, payload)
    else:
        assert status in ANSWERED and payload.strip(), f"HTTP {status}: {payload[:300]!r}"


# ---------------------------------------------------------------- the cases, one by one


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        pytest.param(b"\xff\xfe not utf-8", 400, "not JSON", id="not-utf8"),
        pytest.param(b"{", 400, "not JSON", id="not-json"),
        pytest.param(b"[1, 2]", 400, "must be an AdmissionReview object", id="a-list"),
        pytest.param(b'"review"', 400, "must be an AdmissionReview object", id="a-string"),
        pytest.param(b"{}", 400, "field request is missing", id="no-request"),
        pytest.param(b'{"request": {}}', 400, "field request.uid is missing", id="no-uid"),
        pytest.param(b'{"request": {"uid": 7}}', 400, "request.uid", id="uid-not-a-string"),
        pytest.param(b"x" * (2 * 1024 * 1024), 413, "Maximum request body size", id="2-MiB"),
    ],
)
def test_a_body_that_is_no_review_is_answered_400_with_the_reason(
    webhook: Webhook, body: bytes, status: int, says: str
) -> None:
    got, payload = webhook.post(body)
    assert got == status, payload
    assert says in payload.decode(errors="replace")


def _without(path: str) -> dict[str, Any]:
    review = copy.deepcopy(REVIEW)
    *parents, last = path.split(".")
    node: Any = review
    for step in parents:
        node = node[step]
    del node[last]
    return review


def _with(path: str, value: Any) -> dict[str, Any]:
    review = copy.deepcopy(REVIEW)
    *parents, last = path.split(".")
    node: Any = review
    for step in parents:
        node = node[step]
    node[last] = value
    return review


@pytest.mark.parametrize(
    ("review", "says"),
    [
        pytest.param(
            _with("apiVersion", "admission.k8s.io/v1beta1"), "field apiVersion", id="v1beta1"
        ),
        pytest.param(_with("kind", "Review"), "field kind", id="kind"),
        pytest.param(_without("request.resource"), "field request.resource", id="no-resource"),
        pytest.param(
            _with("request.resource", {"group": "", "version": "v1", "resource": "secrets"}),
            "field request.resource",
            id="secrets",
        ),
        pytest.param(_with("request.subResource", "status"), "request.subResource", id="status"),
        pytest.param(_with("request.operation", "CONNECT"), "request.operation", id="connect"),
        pytest.param(_without("request.userInfo"), "field request.userInfo", id="no-userinfo"),
        pytest.param(_without("request.object"), "field request.object", id="no-object"),
        pytest.param(_with("request.object", "pod"), "field request.object", id="object-string"),
        pytest.param(
            _with("request.object", {**WEBHOOK_POD, "kind": "Secret"}),
            "field request.object.kind",
            id="not-a-pod",
        ),
        pytest.param(
            _with("request.object", {**WEBHOOK_POD, "metadata": ["p"]}),
            "field request.object.metadata",
            id="metadata-list",
        ),
        pytest.param(
            _with("request.object", {**WEBHOOK_POD, "spec": "x"}),
            "field request.object.spec",
            id="spec-string",
        ),
        pytest.param(
            review_of({**WEBHOOK_POD, "spec": {"schedulingGates": "gate"}}),
            "Pod default/p: spec.schedulingGates must be a list",
            id="gates-string",
        ),
        pytest.param(
            review_of({**WEBHOOK_POD, "spec": {"schedulingGates": [{"name": 3}]}}),
            "Pod default/p: spec.schedulingGates must be a list",
            id="gate-name-a-number",
        ),
    ],
)
def test_a_malformed_review_is_denied_with_its_uid_and_the_field(
    webhook: Webhook, review: dict[str, Any], says: str
) -> None:
    status, payload = webhook.post(json.dumps(review).encode())
    assert status == 200, payload
    response = json.loads(payload)["response"]
    assert response["uid"] == UID and response["allowed"] is False
    assert says in response["status"]["message"], response["status"]["message"]
    assert_answered(review, status, payload)


def test_a_pod_of_the_reservations_workload_is_allowed_with_our_gate(webhook: Webhook) -> None:
    """The positive control: a well-formed review reaches our handler through kopf."""
    status, payload = webhook.post(json.dumps(REVIEW).encode())
    assert status == 200, payload
    response = json.loads(payload)["response"]
    assert response["uid"] == UID and response["allowed"] is True, response
    assert gates_after(REVIEW["request"]["object"], response) == [{"name": "other"}, OURS]


def test_a_pod_naming_a_reservation_that_does_not_exist_is_denied_naming_the_label(
    webhook: Webhook,
) -> None:
    pod = copy.deepcopy(WEBHOOK_POD)
    pod["metadata"]["labels"][L.LABEL_RESERVATION] = "someone-elses"
    status, payload = webhook.post(json.dumps(review_of(pod)).encode())
    response = json.loads(payload)["response"]
    assert status == 200 and response["allowed"] is False and response["status"]["code"] == 403
    assert response["status"]["message"].startswith("Pod default/p: ResourceReservation")
    assert L.LABEL_RESERVATION in response["status"]["message"]
