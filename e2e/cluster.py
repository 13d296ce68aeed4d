#!/usr/bin/env python3
"""A real local control plane for nexus-admit's integration and e2e tests.

    python3 e2e/cluster.py up       # build or reuse binaries, start everything, wait ready
    python3 e2e/cluster.py status   # components, PIDs, health, kubeconfig path
    python3 e2e/cluster.py logs [component] [-n LINES]
    python3 e2e/cluster.py down [--keep-logs]
    python3 e2e/cluster.py restart etcd [--outage S]   # kill one component, start it again

Components, all started as background processes of this machine (no containers):
etcd -> kube-apiserver (secure serving, RBAC+Node authz, service-account keys) ->
kube-controller-manager + kube-scheduler -> KWOK controller (fake GPU nodes from
e2e/fleet.yaml, plus their NodeResourceTopology objects) -> Kueue (webhooks on 127.0.0.1
with a generated CA, the cluster's webhook configurations rewritten to URLs) and the
workload controllers that were built (JobSet, LeaderWorkerSet, Kubeflow Trainer, KubeRay,
MPI operator: plane/components.py), Kueue's frameworks list naming exactly those.

Binaries come from e2e/build/build.sh (Go modules, cached per component). State (PKI,
configs, etcd data, logs, PIDs, kubeconfig) lives in $NEXUS_E2E_STATE, default
<repo>/.e2e-state; the admin kubeconfig is <state>/kubeconfig.

Environment: NEXUS_E2E_STATE (state dir), NEXUS_E2E_BIN (use this binary dir, skip the
build), NEXUS_CACHE (build cache root, see build.sh), NEXUS_E2E_FLEET_NODES (fleet.yaml
scaled to about this many nodes; unset: fleet.yaml as written, 64 nodes),
NEXUS_E2E_NODE_GRACE_SECONDS (node lease duration and node-monitor grace period; unset:
40 s and the controller-manager's default), NEXUS_E2E_CONTROLLERS (the workload controllers
to run, comma-separated or "none"; unset: all built), NEXUS_E2E_KUBERNETES (`newest`, the
default, or `oldest`: the plane on the oldest Kubernetes the README promises, versions.env's
KUBERNETES_OLDEST_VERSION, with a state directory of its own, <repo>/.e2e-state-oldest).

The PKI is in plane/pki.py, process handling in plane/processes.py, what runs and its
configuration in plane/components.py, the environment and binaries in plane/environment.py.
Cluster is built of three parts: its state directory (plane/state_files.py), its processes
(plane/supervisor.py) and its objects through kubectl (plane/objects.py); this file keeps
the bring-up sequence and the CLI.
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

E2E_DIR = Path(__file__).resolve().parent
REPO = E2E_DIR.parent
sys.path.insert(0, str(E2E_DIR))
import fleet as fleet_mod  # noqa: E402
from plane.components import (  # noqa: E402
    COMPONENTS,
    KUEUE_NAMESPACE,
    SERVICE_CIDR,
    Launch,
    WorkloadController,
    apiserver_argv,
    controller_manager_argv,
    etcd_argv,
    installed_controllers,
    kueue_config,
    kueue_webhooks,
    kwok_config,
    scheduler_argv,
    webhook_configurations,
)
from plane.environment import (  # noqa: E402
    build_binaries,
    default_state_dir,
    fleet_spec,
    kubernetes_line,
    node_grace_seconds,
)
from plane.objects import CONFIGMAP_PARAM_KEEPER, PlaneObjects  # noqa: E402
from plane.pki import (  # noqa: E402  (_pki, _key_pem: used by nexus_controller.py)
    _key_pem,
    _pki,
    ensure_kueue_metrics_cert,
    generate_pki,
    write_kubeconfig,
)
from plane.processes import (  # noqa: E402
    ClusterError,
    ComponentExited,
    _insecure_ctx,
    free_port,
    log,
)
from plane.supervisor import Supervisor  # noqa: E402

__all__ = [
    "COMPONENTS",
    "KUEUE_NAMESPACE",
    "Cluster",
    "ClusterError",
    "ComponentExited",
    "_key_pem",
    "_pki",
    "build_binaries",
    "default_state_dir",
    "fleet_spec",
    "free_port",
    "kubernetes_line",
    "log",
    "node_grace_seconds",
]


def _tls_listening(port: int) -> bool:
    """A TLS server answers a handshake on 127.0.0.1:port (a webhook server that is up)."""
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=2) as raw,
            _insecure_ctx().wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            return True
    except (OSError, ssl.SSLError):
        return False


# --------------------------------------------------------------------------- cluster


class Cluster(Supervisor, PlaneObjects):
    """A local control plane rooted at a state directory (see the module docstring): its
    files, processes and objects come from its parts; it keeps the bring-up sequence."""

    def __init__(self, state: Path | str | None = None, bin_dir: Path | str | None = None):
        self.state = Path(state).resolve() if state else default_state_dir()
        self._bin = Path(bin_dir) if bin_dir else None
        self._procs: dict[str, subprocess.Popen] = {}
        self._lock_depth = 0
        # set by up(): False when it found the cluster already running (someone else's)
        self.started_here = False
        self.timings: dict[str, float] = {}

    def up(self) -> Cluster:
        with self._lock():
            return self._up_locked()

    def _up_locked(self) -> Cluster:
        if self.is_up():
            log(f"already up (state {self.state}); nothing to do")
            self.started_here = False
            return self
        self.started_here = True
        if self.state.exists():
            log(f"cleaning stale state in {self.state}")
            self.down()
        t_start = time.monotonic()
        t0 = time.monotonic()
        bin_dir = self.bin
        self.timings["build"] = round(time.monotonic() - t0, 2)
        for attempt in (1, 2):
            try:
                self._attempt(bin_dir)
                break
            except ComponentExited as e:
                # Seen twice before up/down took the lock (most likely a concurrent `up` on
                # the same state directory killing the fresh processes as "stale"); one
                # clean retry keeps CI robust if anything similar ever happens again.
                if attempt == 2:
                    raise
                log(f"attempt {attempt} failed ({e.args[0].splitlines()[0]}); retrying once")
        info = self.info()
        info["ready"] = True
        self.timings["total"] = round(time.monotonic() - t_start, 2)
        info["timings"] = self.timings
        self._save_info(info)
        log(f"up in {self.timings['total']}s; KUBECONFIG={self.kubeconfig}")
        return self

    def _attempt(self, bin_dir: Path) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        for d in ("logs", "config", "etcd"):
            (self.state / d).mkdir(exist_ok=True)
        ports: dict[str, int] = {}
        for k in (
            "etcd",
            "etcd_peer",
            "apiserver",
            "kcm",
            "scheduler",
            "kwok",
            "kueue_webhook",
            "kueue_health",
            *(
                f"{c.name}_{kind}"
                for c in installed_controllers(bin_dir)
                for kind in ("webhook", "health")
            ),
        ):
            p = free_port()
            while p in ports.values():
                p = free_port()
            ports[k] = p
        server = f"https://127.0.0.1:{ports['apiserver']}"
        self._save_info(
            {
                "bin": str(bin_dir),
                "ports": ports,
                "server": server,
                "ready": False,
                "components": {},
                "controllers": [c.name for c in installed_controllers(bin_dir)],
                "started": time.strftime("%F %T"),
            }
        )
        try:
            self._up(bin_dir, ports, server)
        except BaseException:
            log(f"bring-up failed; stopping what was started (logs kept in {self.logs_dir})")
            self.down(keep_logs=True)
            raise

    def _up(self, b: Path, ports: dict[str, int], server: str) -> None:
        controllers = installed_controllers(b)
        self._write_pki(server, controllers)
        self._start_etcd_and_apiserver(b, ports, server)
        # scheduler and kwok now; the CRDs go in before the controller-manager starts so that
        # its garbage collector watches Kueue objects from its first discovery on.
        self._spawn("kube-scheduler", scheduler_argv(b, self.config_dir, self.pki, ports))
        kwok_cfg = self.config_dir / "kwok.yaml"
        kwok_cfg.write_text(kwok_config(b, ports, node_grace_seconds(), E2E_DIR / "kwok"))
        self._spawn(
            "kwok",
            [
                str(b / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={kwok_cfg}",
                f"--server-address=127.0.0.1:{ports['kwok']}",
            ],
        )
        self._install_crds(b, ports, controllers)
        self._spawn(
            "kube-controller-manager",
            controller_manager_argv(b, self.config_dir, self.pki, ports, node_grace_seconds()),
        )
        self._start_kueue_and_controllers(b, ports, controllers)
        spec = self._apply_fleet()  # while Kueue starts
        for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
            self._wait(name, lambda n=name: self._health(n, ports), 60, [name])
        self._wait("kueue", lambda: self._health("kueue", ports), 120, ["kueue"])
        log("kueue readyz ok")
        self.apply(kueue_webhooks(b, ports["kueue_webhook"], (self.pki / "ca.crt").read_bytes()))
        self._wait("kueue-webhook", self._webhook_answers, 60, ["kueue"])
        log("Kueue webhooks answer (dry-run Job was suspended)")
        self._controllers_ready(b, controllers, ports)
        self.apply((E2E_DIR / "manifests" / "kueue.yaml").read_text(), retries=20)
        if kubernetes_line() == "newest":  # the oldest plane serves no such policy
            self.apply(CONFIGMAP_PARAM_KEEPER)
        self._wait_settled(len(fleet_mod.nodes(spec)))

    def _write_pki(self, server: str, controllers: list[WorkloadController]) -> None:
        t = time.monotonic()
        webhook_servers = ["kueue", *(c.name for c in controllers if c.serves_webhooks)]
        generate_pki(self.pki, SERVICE_CIDR, webhook_servers)
        write_kubeconfig(self.kubeconfig, server, self.pki, "admin")
        for user in ("kube-controller-manager", "kube-scheduler"):
            write_kubeconfig(self.config_dir / f"{user}.kubeconfig", server, self.pki, user)
        self.timings["pki"] = round(time.monotonic() - t, 2)

    def _start_etcd_and_apiserver(self, b: Path, ports: dict[str, int], server: str) -> None:
        self._spawn("etcd", etcd_argv(b, self.state, ports))
        self._wait("etcd", lambda: self._health("etcd", ports), 30, ["etcd"])
        log(f"etcd ready on http://127.0.0.1:{ports['etcd']}")
        self._spawn("kube-apiserver", apiserver_argv(b, self.pki, ports))
        self._wait(
            "kube-apiserver",
            lambda: self._health("kube-apiserver", ports),
            90,
            ["etcd", "kube-apiserver"],
        )
        log(f"kube-apiserver ready on {server}")

    def _install_crds(
        self, b: Path, ports: dict[str, int], controllers: list[WorkloadController]
    ) -> None:
        t = time.monotonic()
        self.apply(self._crds(b, ports))
        self.timings["crds-apply"] = round(time.monotonic() - t, 2)
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        self.apply(
            [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}}]
        )
        self.timings["crds"] = round(time.monotonic() - t, 2)
        names = ["Kueue", "NodeResourceTopology", *(c.name for c in controllers)]
        log(f"CRDs established ({', '.join(names)})")

    def _start_kueue_and_controllers(
        self, b: Path, ports: dict[str, int], controllers: list[WorkloadController]
    ) -> None:
        ensure_kueue_metrics_cert(self.pki)
        kueue_cfg = self.config_dir / "kueue.yaml"
        kueue_cfg.write_text(yaml.safe_dump(kueue_config(b, self.pki, ports), sort_keys=False))
        self._spawn(
            "kueue",
            [str(b / "kueue"), f"--config={kueue_cfg}"],
            env={"KUBECONFIG": str(self.kubeconfig)},
        )
        for c in controllers:
            launch = Launch(
                bin=b,
                config_dir=self.config_dir,
                pki=self.pki,
                kubeconfig=self.kubeconfig,
                state=self.state,
                webhook_port=ports[f"{c.name}_webhook"],
                health_port=ports[f"{c.name}_health"],
            )
            argv, env = c.command(launch)
            self._spawn(c.name, argv, env=env)

    def _apply_fleet(self) -> dict[str, Any]:
        t = time.monotonic()
        spec = fleet_spec()
        objects = fleet_mod.nodes(spec) + fleet_mod.node_resource_topologies(spec)
        for i in range(0, len(objects), 250):  # chunks: a 1,000-node fleet in one call times out
            self.apply(objects[i : i + 250])
        self.timings["fleet-apply"] = round(time.monotonic() - t, 2)
        log(f"fleet applied ({sum(s['nodes'] for s in fleet_mod.summary(spec).values())} nodes)")
        return spec

    def _wait_settled(self, total_nodes: int) -> None:
        """Every node Ready, every ClusterQueue active, the default ServiceAccount made."""
        self._wait(
            "nodes-ready",
            lambda: self._count_ready_nodes() >= total_nodes,
            max(120, total_nodes * 0.3),  # KWOK initialises a 1,000-node fleet in minutes
            ["kwok", "kube-controller-manager"],
        )
        log(f"{total_nodes} fake nodes Ready")
        self._wait("clusterqueues-active", self._clusterqueues_active, 60, ["kueue"])
        self._wait(
            "default-serviceaccount",
            lambda: (
                self.kubectl(
                    "get", "serviceaccount", "default", "-n", "default", check=False
                ).returncode
                == 0
            ),
            60,
            ["kube-controller-manager"],
        )
        log("ClusterQueues active")

    def _controllers_ready(
        self, b: Path, controllers: list[WorkloadController], ports: dict[str, int]
    ) -> None:
        """Wait for each workload controller's readyz, then register its webhooks."""
        for c in controllers:
            self._wait(c.name, lambda c=c: self._health(c.name, ports), 120, [c.name])
            if c.serves_webhooks:
                self.apply(
                    webhook_configurations(
                        b / "manifests" / c.name / "webhook",
                        c.name,
                        ports[f"{c.name}_webhook"],
                        (self.pki / "ca.crt").read_bytes(),
                    )
                )
                self._wait(
                    f"{c.name}-webhook",
                    lambda c=c: _tls_listening(ports[f"{c.name}_webhook"]),
                    60,
                    [c.name],
                )
        if controllers:
            log("workload controllers ready: " + ", ".join(c.name for c in controllers))


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="e2e/cluster.py", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--state", help="state directory (default $NEXUS_E2E_STATE or <repo>/.e2e-state)"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("up", help="start the control plane (no-op when already up)")
    d = sub.add_parser("down", help="stop every component started here and clean the state")
    d.add_argument("--keep-logs", action="store_true")
    sub.add_parser("status", help="print component status as JSON")
    lg = sub.add_parser("logs", help="print the tail of component logs")
    lg.add_argument("component", nargs="?", choices=COMPONENTS)
    lg.add_argument("-n", "--lines", type=int, default=40)
    sub.add_parser("build", help="only build or locate the binaries; print their directory")
    rs = sub.add_parser("restart", help="kill one component and start it again (fault tests)")
    rs.add_argument("component", choices=COMPONENTS)
    rs.add_argument("--outage", type=float, default=2.0, help="seconds it stays down")
    args = ap.parse_args(argv)

    c = Cluster(args.state)
    try:
        if args.cmd == "up":
            c.up()
            print(c.kubeconfig)
        elif args.cmd == "down":
            c.down(keep_logs=args.keep_logs)
        elif args.cmd == "status":
            s = c.status()
            print(json.dumps(s, indent=2))
            return 0 if c.is_up() else 3
        elif args.cmd == "logs":
            for name in [args.component] if args.component else COMPONENTS:
                print(f"===== {name} ({c.logs_dir / (name + '.log')})")
                print(c.log_tail(name, args.lines))
        elif args.cmd == "build":
            print(build_binaries())
        elif args.cmd == "restart":
            print(f"{args.component} unavailable for {c.restart(args.component, args.outage):.1f}s")
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
