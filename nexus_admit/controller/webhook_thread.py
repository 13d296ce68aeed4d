"""The pod webhook's HTTPS server, on a thread and an event loop of its own.

Who calls it: `operator.py` starts one `WebhookThread` after the first full list and stops
it on the way out; the HTTP fuzz test starts one the same way. Why a thread: every pod of a
gang passes this webhook at creation, and the Job controller creates a gang's pods a few
at a time, each waiting for its answer, so the webhook's latency is the gang's pod-creation
time. On the main loop it waited behind kopf's processing of watch events and the placing
pass's synchronous steps (p99 0.83 s on the 1,000-node load benchmark). Here it waits for
the GIL at most (5 ms switch interval), not for the loop.

What runs here: kopf's admission function (`serve_admission_request`, as kopf's own
`running.py` wires it; kopf offers no public way to run only the webhook, hence the private
imports, pinned by `kopf>=1.45,<2`) in front of our handler registry, behind the
`GuardedWebhookServer`, and the certificate watch, so that reloading the certificate and
TLS handshakes happen on the same thread. The handler reads the store (plain dict reads)
and hands anything it fetched to the main loop (`Context.call_in_loop`), which alone
writes the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from typing import Any, cast

import kopf
from kopf._cogs.structs import references
from kopf._core.engines import admission, indexing
from kopf._core.reactor import inventory

from nexus_admit.controller.tls import ServingCertificate

__all__ = ["WebhookThread"]

log = logging.getLogger("nexus_admit.webhook")

POD = references.Resource("", "v1", "pods", kind="Pod", namespaced=True)


class WebhookThread:
    """Serves `registry`'s admission handlers with `settings.admission.server`."""

    def __init__(
        self,
        settings: kopf.OperatorSettings,
        registry: kopf.OperatorRegistry,
        memo: kopf.Memo,
        cert: ServingCertificate | None = None,
        cert_check_seconds: float = 10.0,
    ) -> None:
        if settings.admission.server is None:
            raise ValueError("the webhook thread needs settings.admission.server")
        self.settings = settings
        self.registry = registry
        self.memo = memo
        self.cert = cert
        self.cert_check_seconds = cert_check_seconds
        self.listening = threading.Event()
        self._failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="webhook", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        """Start serving; returns once the server listens, raises if it cannot."""
        self._thread.start()
        if not self.listening.wait(timeout):
            raise RuntimeError(f"the webhook server did not listen within {timeout:.0f}s")
        if self._failed is not None:
            raise RuntimeError(f"the webhook server did not start: {self._failed}")

    def stop(self, timeout: float = 10.0) -> None:
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended meanwhile
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout)

    def alive(self) -> bool:
        return self.listening.is_set() and self._thread.is_alive() and self._failed is None

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by start() or alive(); the thread ends
            self._failed = e
            log.error("webhook server stopped: %s", e, exc_info=e)
        finally:
            self.listening.set()  # never leave start() waiting

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        insights = references.Insights()
        insights.webhook_resources.add(POD)
        serve = functools.partial(
            admission.serve_admission_request,
            settings=self.settings,
            registry=self.registry,
            insights=insights,
            memories=inventory.ResourceMemories(),
            memobase=cast(Any, self.memo),  # kopf's AnyMemo is a private alias
            indices=indexing.OperatorIndexers().indices,
        )
        server = self.settings.admission.server
        assert server is not None  # checked in __init__
        serving: Any = server(serve)
        await serving.__anext__()  # bound and listening
        watch = None
        if self.cert is not None:
            watch = asyncio.create_task(self.cert.watch(self.cert_check_seconds))
        self.listening.set()
        try:
            await self._stop.wait()
        finally:
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            await serving.aclose()
