"""Wiring only: builds the context, registers the handlers, runs kopf and the loop.

Who calls it: `nexus-admit run` (`commands/run.py`). Start-up order matters: the store is
filled by a full list before the watch streams and the loop start, so the first decision already
sees every reservation; the health endpoint comes up first, the pod webhook once the kinds
its answers read are listed (`lists.EARLY_KINDS`; it asks the API for any other object it
lacks), before the fleet's list, on a thread and event loop of its own
(`webhook/thread.py`). With
`--leader-elect` every replica watches and serves the webhook, and only the Lease holder's
loop decides (`leader.py`); readiness does not depend on leadership, so the Service sends
webhook calls to every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from nexus_admit.controller.api import API_THREADS, KubeApi, load_api_client
from nexus_admit.controller.context import Context
from nexus_admit.controller.degraded import watch_leadership
from nexus_admit.controller.faults import Faults
from nexus_admit.controller.ledger import Ledger
from nexus_admit.controller.loop.cycle import run_loop
from nexus_admit.controller.metrics_auth import MetricsAuthorizer, bearer_token
from nexus_admit.controller.options import RunOptions
from nexus_admit.controller.runtime import lists
from nexus_admit.controller.runtime.gc_control import keep_heap
from nexus_admit.controller.runtime.informer import run_informers
from nexus_admit.controller.runtime.lease import LeaseConfig, LeaseElector, default_identity
from nexus_admit.controller.store import WATCHED_KINDS
from nexus_admit.controller.ungating.at_creation import (
    PIN_GATE_WEBHOOK_ID,
    PIN_WEBHOOK_ID,
    answer_gate_or_pin_review,
    answer_pin_review,
)
from nexus_admit.controller.ungating.ungater import UngaterState, run_ungater
from nexus_admit.controller.webhook.review import answer_review
from nexus_admit.controller.webhook.server import GuardedWebhookServer
from nexus_admit.controller.webhook.thread import WebhookThread
from nexus_admit.controller.webhook.tls import ServingCertificate
from nexus_admit.placement.policies import make_policy

__all__ = [
    "WEBHOOK_PATH",
    "NoDiffBase",
    "build_context",
    "elect",
    "handler_registry",
    "operator_settings",
    "run",
    "webhook_thread",
]

log = logging.getLogger(__name__)

# kopf serves each admission handler at /<handler id>
WEBHOOK_ID = "pod-gate"
WEBHOOK_PATH = f"/{WEBHOOK_ID}"


def build_context(options: RunOptions) -> Context:
    api = KubeApi(
        load_api_client(options.kubeconfig),
        dry_run=options.dry_run,
        list_page_size=options.list_page_size,
        list_page_timeout=options.list_page_timeout,
    )
    # the watch streams hold their connections for minutes: a pool of their own, so the
    # writes never wait for one (`informer.py`)
    watch_api = KubeApi(
        load_api_client(options.kubeconfig, pool_size=len(WATCHED_KINDS)),
        dry_run=options.dry_run,
    )
    return Context(
        options=options,
        api=api,
        engine=make_policy(options.policy),
        faults=Faults.from_spec(options.fault),
        watch_api=watch_api,
    )


def reset_components(ctx: Context) -> None:
    """A leadership change, taken or lost: every component forgets what a leader must not
    carry into another term (each says what in its `reset()`)."""
    for component in ctx.components():
        component.reset()


def elect(ctx: Context) -> LeaseElector:
    """The Lease elector for `ctx`, wired so that only the leader writes: the KubeApi asks
    `ctx.acting()` before every write, and a lost lease cancels the pass in progress."""
    o = ctx.options
    assert o.lease_namespace is not None  # RunOptions.validate insists
    takeover: list[asyncio.Task[None]] = []

    async def take_over() -> None:
        # the follower's store may lag its watches: one full re-list before the first
        # decision, and a fresh ledger (nothing it assumed as an earlier leader holds)
        ctx.ledger = Ledger()
        reset_components(ctx)
        while ctx.leadership.elector is not None and ctx.leadership.elector.leading():
            try:
                await lists.relist(ctx)
            except Exception as e:  # an outage: try again while we still lead
                log.warning("re-list after becoming leader failed, retrying: %s", e)
                await asyncio.sleep(1)
                continue
            ctx.leadership.ready = True
            ctx.metrics.leader.set(1)
            log.info("leader: store re-listed, deciding from now on")
            ctx.poke()
            return

    async def started() -> None:
        # not awaited here: the elector must keep renewing while a large cluster re-lists
        takeover.append(asyncio.create_task(take_over(), name="leader-takeover"))

    async def stopped() -> None:
        ctx.leadership.ready = False
        ctx.metrics.leader.set(0)
        for t in takeover:
            t.cancel()
        takeover.clear()
        if ctx.signals.pass_task is not None:
            ctx.signals.pass_task.cancel()
        reset_components(ctx)  # the ungater's pass and patches with it

    elector = LeaseElector(
        ctx.api,
        LeaseConfig(
            name=o.lease_name,
            namespace=o.lease_namespace,
            identity=o.leader_identity or default_identity(),
            lease_seconds=o.lease_seconds,
            renew_deadline_seconds=o.renew_deadline_seconds,
            retry_seconds=o.lease_retry_seconds,
        ),
        on_started=started,
        on_stopped=stopped,
        clock=ctx.clocks.monotonic,
    )
    ctx.leadership.elector = elector
    ctx.api.write_guard = ctx.acting
    # fencing: a write sent while leading is given up before the Lease could pass on
    ctx.api.write_timeout = o.lease_seconds - o.renew_deadline_seconds
    return elector


def handler_registry() -> kopf.OperatorRegistry:
    """What kopf runs on the main loop: its login only. The store is fed by our own watch
    streams (`informer.py`: kopf's per-event machinery cost a quarter of the controller's
    busy time at 5,000 nodes); kopf serves the pod webhook (`webhook/`) and runs the process."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # kopf reads $KUBECONFIG at call time (run() set it from --kubeconfig); the official
        # client's own default was fixed at import, so it cannot be used for this
        if os.environ.get("KUBECONFIG"):
            return kopf.login_with_kubeconfig(**kwargs)
        return kopf.login_via_client(**kwargs)

    return registry


def webhook_thread(
    options: RunOptions, ctx: Context, cert: ServingCertificate | None = None
) -> WebhookThread:
    """The pod webhook on a thread of its own, with the certificate `options` names."""
    if cert is None:
        if not (options.webhook_cert and options.webhook_key):
            raise ValueError("the webhook needs --webhook-cert and --webhook-key")
        cert = ServingCertificate(options.webhook_cert, options.webhook_key)
    server = GuardedWebhookServer(
        addr=options.webhook_addr,
        port=options.webhook_port,
        context=cert.context,  # the live context webhook/tls.py reloads in place
        certfile=cert.certfile,
        pkeyfile=cert.keyfile,
        file_check_interval=_KOPF_FILE_CHECK_SECONDS,
    )
    return WebhookThread(
        server,
        {
            WEBHOOK_ID: functools.partial(answer_review, ctx),
            PIN_WEBHOOK_ID: functools.partial(answer_pin_review, ctx),
            PIN_GATE_WEBHOOK_ID: functools.partial(answer_gate_or_pin_review, ctx),
        },
        cert,
        options.webhook_cert_check_seconds,
    )


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf builds a diff base (a deep copy of the object) and clears progress marks for
    every watch event, whatever the handlers; ours are event-watching handlers only, which
    never read either. On the 1,000-node load benchmark that was 18 % of the event loop's
    time. Nothing is stored on the objects, as before."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


# kopf re-reads the certificate files on this period and, on a change, restarts its server
# (a moment without a listener); `webhook/tls.py` reloads them in place instead, so kopf's check is
# pushed out of the way (a year)
_KOPF_FILE_CHECK_SECONDS = 365 * 24 * 3600.0


def operator_settings(list_page_size: int = 0) -> kopf.OperatorSettings:
    """kopf's settings for the watches (the webhook has its own: `webhook_thread`); its own
    list before each watch is read in pages of `list_page_size` (0: whole) as ours are."""
    settings = kopf.OperatorSettings()
    settings.watching.chunk_size = list_page_size or None
    settings.posting.enabled = False  # our Events are written by events.py, on purpose only
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.error_backoffs = [1, 2, 5, 10]
    # no resource handlers: nothing for kopf to discover (it would watch the CRDs for it)
    settings.scanning.disabled = True
    return settings


async def _lag_probe(ctx: Context, interval: float = 0.25) -> None:
    """How late the event loop runs a timer: proof that solves do not block it."""
    while True:
        started = time.perf_counter()
        await asyncio.sleep(interval)
        ctx.metrics.loop_lag_seconds.observe(max(0.0, time.perf_counter() - started - interval))


async def _health_server(ctx: Context, hook: list[WebhookThread]) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        if hook and not hook[0].alive():  # it does not come back: let the kubelet restart us
            return web.Response(status=500, text="webhook server stopped")
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        # with the webhook, ready once it serves (the kinds it reads are listed before it
        # starts, the fleet after): the Service then sends it pod reviews while the placing
        # loop still waits for the full list (`ctx.leadership.synced`)
        if ctx.options.webhook:
            if not (hook and hook[0].alive()):
                return web.Response(status=503, text="webhook not serving")
        elif not ctx.leadership.synced:
            return web.Response(status=503, text="syncing")
        return web.Response(text="ok")

    authorizer = (MetricsAuthorizer(ctx.api, clock=ctx.clocks.monotonic)
                  if ctx.options.metrics_auth == "kubernetes" else None)

    async def metrics(request: web.Request) -> web.Response:
        if authorizer is not None:
            decision = await authorizer.decide(bearer_token(request.headers))
            if decision.status != 200:
                headers = {"WWW-Authenticate": "Bearer"} if decision.status == 401 else {}
                return web.Response(status=decision.status, text=decision.reason, headers=headers)
        body = generate_latest(ctx.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes(
        [web.get("/healthz", healthz), web.get("/readyz", readyz), web.get("/metrics", metrics)]
    )
    tls = _metrics_certificate(ctx, app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(
        runner,
        ctx.options.health_addr,
        ctx.options.health_port,
        ssl_context=tls.context if tls is not None else None,
    )
    await site.start()
    return runner


def _metrics_certificate(ctx: Context, app: web.Application) -> ServingCertificate | None:
    """With --metrics-cert: the port's certificate, checked for a renewed pair as often as
    the webhook's while the server runs (the scraper's bearer token then crosses the
    network encrypted, as with controller-runtime's secure metrics)."""
    o = ctx.options
    if not (o.metrics_cert and o.metrics_key):
        return None
    tls = ServingCertificate(o.metrics_cert, o.metrics_key, serves="metrics")

    async def watch_certificate(_: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(tls.watch(o.webhook_cert_check_seconds), name="metrics-tls")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(watch_certificate)
    return tls


def operator_identity(options: RunOptions) -> Any:
    """The name kopf gives this operator: the leader identity (the pod's name in the
    chart). Left to itself kopf asks `getpass.getuser()`, which fails for a uid without a
    passwd entry (an arbitrary uid a platform assigns) and stops the controller at start."""
    return options.leader_identity or default_identity()


async def run(options: RunOptions) -> None:
    if options.kubeconfig:
        # kopf's own login reads the same kubeconfig as our client
        os.environ["KUBECONFIG"] = options.kubeconfig
    cert = None
    if options.webhook:  # first: an unusable certificate stops us before any API call
        assert options.webhook_cert and options.webhook_key  # RunOptions.validate insists
        cert = ServingCertificate(options.webhook_cert, options.webhook_key)
    ctx = build_context(options)
    if cert is not None:
        cert.on_reload = ctx.metrics.certificate_reloads.inc
    elector = elect(ctx) if options.leader_elect else None
    ctx.metrics.leader.set(0 if elector else 1)
    ctx.signals.loop = asyncio.get_running_loop()
    # room for every concurrent API call (see api.API_THREADS): the default, 4 + cores
    # threads, let a burst of pod pins hold up the placing loop's reservation writes
    ctx.signals.loop.set_default_executor(ThreadPoolExecutor(API_THREADS, thread_name_prefix="api"))
    hook: list[WebhookThread] = []  # started once the store is synced
    runner = await _health_server(ctx, hook)
    _log_start(options, elector)
    await lists.list_early(ctx)
    if cert is not None:  # after the kinds its answers read; before the fleet's list
        hook.append(webhook_thread(options, ctx, cert))
        await asyncio.to_thread(hook[0].start)
    await lists.initial_list(ctx)
    tasks = _start_tasks(ctx, elector, options.degraded_after_seconds)
    try:
        await kopf.operator(
            registry=handler_registry(),
            settings=operator_settings(options.list_page_size),
            clusterwide=True,
            standalone=True,
            identity=operator_identity(options),
            memo=kopf.Memo(ctx=ctx),
        )
    finally:
        await _shut_down(ctx, hook, tasks, runner)


def _log_start(options: RunOptions, elector: LeaseElector | None) -> None:
    log.info(
        "nexus-admit starting: policy %s, dry-run %s, webhook %s, health/metrics on :%s "
        "(%s, metrics auth: %s)",
        options.policy,
        options.dry_run,
        f"{options.webhook_addr}:{options.webhook_port}{WEBHOOK_PATH}"
        if options.webhook
        else "off",
        options.health_port,
        "https" if options.metrics_cert else "http",
        options.metrics_auth,
    )
    if elector is not None:
        c = elector.config
        log.info(
            "leader election on: lease %s/%s as %s (lease %ss, renew deadline %ss, retry %ss)",
            c.namespace,
            c.name,
            c.identity,
            c.lease_seconds,
            c.renew_deadline_seconds,
            c.retry_seconds,
        )


def _start_tasks(
    ctx: Context, elector: LeaseElector | None, degraded_after_seconds: float
) -> list[asyncio.Task[None]]:
    """The controller's own tasks: the store's watch streams and the loops."""
    tasks = [
        # the store's watch streams, each from the version its kind was listed at
        asyncio.create_task(run_informers(ctx), name="informers"),
        asyncio.create_task(run_loop(ctx), name="placing"),
        asyncio.create_task(run_ungater(ctx), name="ungating"),
        asyncio.create_task(lists.resync_loop(ctx), name="resync"),
        asyncio.create_task(_lag_probe(ctx), name="lag-probe"),
        asyncio.create_task(keep_heap(ctx), name="heap"),
    ]
    if elector is not None:
        tasks.append(
            asyncio.create_task(
                watch_leadership(ctx, elector, degraded_after_seconds), name="degraded"
            )
        )
    if elector is not None:  # last: cancelled last, it releases the lease on the way out
        tasks.append(asyncio.create_task(elector.run(), name="leader-election"))
    return tasks


async def _shut_down(
    ctx: Context,
    hook: list[WebhookThread],
    tasks: list[asyncio.Task[None]],
    runner: web.AppRunner,
) -> None:
    for h in hook:
        await asyncio.to_thread(h.stop)
    if ctx.signals.pass_task is not None:
        ctx.signals.pass_task.cancel()
    ctx.component(UngaterState).stop()
    ctx.workers.background.cancel()
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t
    await runner.cleanup()
    ctx.workers.solver.shutdown(wait=False, cancel_futures=True)
