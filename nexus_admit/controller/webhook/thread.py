"""The pod webhook's HTTPS server, on a thread and an event loop of its own.

Who calls it: `operator.py` starts one `WebhookThread` after the first full list and stops
it on the way out; the HTTP fuzz test starts one the same way. Why a thread: every pod of a
gang passes this webhook at creation, and the Job controller creates a gang's pods a few
at a time, each waiting for its answer, so the webhook's latency is the gang's pod-creation
time. On the main loop it waited behind kopf's processing of watch events and the placing
pass's synchronous steps (p99 0.83 s on the 1,000-node load benchmark). Here it waits for
the GIL at most, not for the loop.

What runs here: the `GuardedWebhookServer` (kopf's TLS server, every request checked
first), which hands each review to the answer of its path (`review.answer_review` at
/pod-gate, `ungating.at_creation.answer_pin_review` at /pod-pin): kopf's own admission
machinery is not in the path, since it cost ~5 ms of CPU per pod for what is one JSON patch;
and the certificate watch, so that reloading the certificate and TLS handshakes happen on
the same thread. The answer reads the store (plain dict reads) and hands anything it
fetched to the main loop (`Context.call_in_loop`), which alone writes the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, cast

import kopf

from nexus_admit.controller.webhook.server import UnknownWebhookPath
from nexus_admit.controller.webhook.tls import ServingCertificate

__all__ = ["Answer", "WebhookStartError", "WebhookThread"]

log = logging.getLogger(__name__)

Answer = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]  # review → response


class WebhookStartError(RuntimeError):
    """The webhook server could not listen (the address taken, a bad certificate)."""


class WebhookThread:
    """Serves each answer of `answers` at /<its id> with `server`; any other path is
    answered 404."""

    def __init__(
        self,
        server: kopf.WebhookServer,
        answers: Mapping[str, Answer],
        cert: ServingCertificate | None = None,
        cert_check_seconds: float = 10.0,
    ) -> None:
        self.server = server
        self.answers = dict(answers)
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
            raise WebhookStartError(f"the webhook server did not listen within {timeout:.0f}s")
        if self._failed is not None:
            raise WebhookStartError(str(self._failed)) from self._failed

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

        async def serve(review: Mapping[str, Any], *, webhook: str | None, **_: Any) -> Any:
            answer = self.answers.get(webhook or "")
            if answer is None:
                raise UnknownWebhookPath(f"no webhook at /{webhook}")
            return await answer(review)

        serving: Any = self.server(cast(Any, serve))  # kopf's WebhookFn, loosely typed
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
