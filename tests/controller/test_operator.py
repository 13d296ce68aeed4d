"""Process set-up of `nexus-admit run` that the e2e tests cannot see: the health/metrics
port served over TLS (`--metrics-cert`), the operator's identity. (The malloc arena cap is
the image's and the chart's MALLOC_ARENA_MAX: tests/charts checks it.)"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from nexus_admit.controller.context import Context
from nexus_admit.controller.operator import _health_server, operator_settings
from nexus_admit.controller.options import OptionsError, RunOptions
from tests.controller.webhook.test_tls import issue, served_serial


def _options(tmp_path: Path, **tls: Any) -> RunOptions:
    return RunOptions(
        webhook=False,
        health_addr="127.0.0.1",
        health_port=0,
        webhook_cert_check_seconds=0.05,
        **tls,
    ).validate()


async def _get(port: int, path: str, tls: ssl.SSLContext | None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        url = f"{'https' if tls else 'http'}://127.0.0.1:{port}{path}"
        async with session.get(url, ssl=tls if tls else False) as r:
            return r.status, await r.text()


def test_metrics_are_served_over_tls_with_a_certificate_reloaded_in_place(
    tmp_path: Path,
) -> None:
    """--metrics-cert/--metrics-key: the health/metrics port speaks only TLS, with the
    certificate given, and a renewed pair is served to new connections (as the webhook's)."""
    first = issue(tmp_path)
    options = _options(
        tmp_path, metrics_cert=str(tmp_path / "tls.crt"), metrics_key=str(tmp_path / "tls.key")
    )
    ctx = Context(options=options, api=None, engine=None)  # type: ignore[arg-type]
    trust = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
    trust.check_hostname = False  # the test certificate names no host

    async def scenario() -> None:
        runner = await _health_server(ctx, [])
        try:
            port = runner.addresses[0][1]
            status, text = await _get(port, "/metrics", trust)
            assert status == 200 and "nexus_admit_" in text
            assert (await _get(port, "/healthz", trust))[0] == 200
            with pytest.raises(aiohttp.ClientError):
                await _get(port, "/metrics", None)  # plain HTTP is not answered
            assert await served_serial(port) == first
            second = issue(tmp_path)
            for _ in range(200):
                if await served_serial(port) == second:
                    break
                await asyncio.sleep(0.05)
            assert await served_serial(port) == second, "the renewed pair is served"
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def test_plain_http_without_a_metrics_certificate(tmp_path: Path) -> None:
    ctx = Context(options=_options(tmp_path), api=None, engine=None)  # type: ignore[arg-type]

    async def scenario() -> None:
        runner = await _health_server(ctx, [])
        try:
            assert (await _get(runner.addresses[0][1], "/healthz", None))[0] == 200
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


@pytest.mark.parametrize("given", ["metrics_cert", "metrics_key"])
def test_a_metrics_certificate_needs_its_key(tmp_path: Path, given: str) -> None:
    issue(tmp_path)
    with pytest.raises(OptionsError, match="go together"):
        _options(tmp_path, **{given: str(tmp_path / "tls.crt")})


class _Serving:
    """A stand-in for the webhook thread in `_health_server`'s list: alive or not."""

    def __init__(self, alive: bool) -> None:
        self._alive = alive

    def alive(self) -> bool:
        return self._alive


@pytest.mark.parametrize(
    ("webhook", "serving", "synced", "ready"),
    [
        (True, None, False, 503),  # the webhook's kinds not listed yet: not started
        (True, True, False, 200),  # serving while the fleet is still being listed
        (True, False, True, 503),  # its server stopped
        (False, None, False, 503),  # no webhook: ready once the store is synced
        (False, None, True, 200),
    ],
)
def test_readiness_is_the_webhook_serving_or_without_it_the_first_full_list(
    tmp_path: Path, webhook: bool, serving: bool | None, synced: bool, ready: int
) -> None:
    options = RunOptions(webhook=webhook, health_addr="127.0.0.1", health_port=0)
    ctx = Context(options=options, api=None, engine=None)  # type: ignore[arg-type]
    ctx.leadership.synced = synced
    hook: list[Any] = [] if serving is None else [_Serving(serving)]

    async def scenario() -> None:
        runner = await _health_server(ctx, hook)
        try:
            assert (await _get(runner.addresses[0][1], "/readyz", None))[0] == ready
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def test_kopfs_own_lists_are_read_in_the_same_pages() -> None:
    assert operator_settings(500).watching.chunk_size == 500
    assert operator_settings(0).watching.chunk_size is None


def test_the_operator_is_named_without_asking_the_passwd_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A platform may run the image under an arbitrary uid with no passwd entry, where
    `getpass.getuser()` raises: kopf is given the leader identity instead of asking."""
    import getpass

    from nexus_admit.controller.operator import operator_identity
    from nexus_admit.controller.options import RunOptions

    def no_user() -> str:
        raise KeyError("getpwuid(): uid not found: 1000650000")

    monkeypatch.setattr(getpass, "getuser", no_user)
    assert operator_identity(RunOptions(webhook=False, leader_identity="nexus-0")) == "nexus-0"
    assert "_" in operator_identity(RunOptions(webhook=False))  # hostname_pid
