"""The container image, built and run: `make image`'s script (e2e/build/image.sh, buildah)
builds the Dockerfile on a base made here from Debian packages (e2e/build/local-base.sh,
debootstrap: the public base cannot be pulled on this machine); the image's own
ENTRYPOINT and CMD then run as the image's non-root USER, chrooted into the image's
unpacked root filesystem (`buildah mount`), against the local control plane, and place a
gang whose pods the scheduler binds to the reserved nodes. The controller is in the image,
the cluster outside, as with the chart.

Also checked: no compiler, Go, container builder or test dependency is inside. The image's
size and the build time are printed and written to reports/image/image.json.

Needs root, buildah and debootstrap (`.ci/run` installs the two packages when missing);
skipped, with the reason, without them. NEXUS_E2E_IMAGE_BASE names another base (e.g. the
public python:3.11-slim where it can be pulled; then debootstrap is not needed).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from builders import create_local_queue
from e2e_util import wait_for
from nexus_controller import NexusController
from test_controller import (
    INDEX,
    SLOT,
    check_entry,
    job,
    reservation_of,
    running,
    slots_of,
    wait_check,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300, func_only=True)]

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "e2e" / "build" / "image.sh"
LOCAL_BASE = ROOT / "e2e" / "build" / "local-base.sh"
REPORT = ROOT / "reports" / "image" / "image.json"
BASE = os.environ.get("NEXUS_E2E_IMAGE_BASE", "local")
# where the controller's files go inside the image (the chart mounts its webhook certificate
# at the same place)
CONFIG_DIR = "/etc/nexus-admit"
# build tools, container tools and test runners: none may be an executable on the image's PATH
FORBIDDEN_EXECUTABLES = (
    *("gcc", "cc", "c++", "g++", "clang", "ld", "as", "make", "go", "gofmt"),
    *("buildah", "podman", "docker", "debootstrap"),
    *("pytest", "py.test", "mypy", "ruff", "lint-imports", "hypothesis"),
)
# in the dev extra and needed at run time all the same
RUNTIME_TOO = {
    "jsonpatch": "kopf requires it",
    "setuptools": "the base's Python environment ships it beside pip, as python:3.11-slim does",
}


@dataclass(frozen=True)
class Image:
    name: str
    config: dict[str, Any]  # the OCI image config's `config`: Entrypoint, Cmd, User, Env
    layer_bytes: list[int]
    base_layer_count: int
    build_seconds: float
    reused: bool  # an image built from the same inputs was there already


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (buildah's storage, chroot, debootstrap)"
    needed = ["buildah", "chroot", "unshare"] + (["debootstrap"] if BASE == "local" else [])
    missing = [tool for tool in needed if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install {' '.join(missing)})"
    return None


def _buildah(*args: str) -> str:
    r = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"buildah {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip()


def _layers(name: str) -> list[int]:
    manifest = json.loads(_buildah("inspect", "--type", "image", "--format", "{{.Manifest}}", name))
    return [layer["size"] for layer in manifest["layers"]]


@pytest.fixture(scope="module")
def image() -> Image:
    reason = _skip_reason()
    if reason:
        pytest.skip(f"the image is not built here: {reason}")
    started = time.monotonic()
    # pip in the build uses the pip configuration of the python running the tests
    env = {**os.environ, "IMAGE_BASE": BASE, "PYTHON": sys.executable}
    r = subprocess.run(
        ["bash", str(BUILD)], capture_output=True, text=True, env=env, timeout=1800, check=False
    )
    if r.returncode != 0:
        pytest.fail(f"e2e/build/image.sh failed:\n{r.stderr[-4000:]}", pytrace=False)
    seconds = time.monotonic() - started
    name = r.stdout.strip().splitlines()[-1]
    info = json.loads(_buildah("inspect", "--type", "image", name))
    base = BASE
    if BASE == "local":  # cached by now: prints its name at once
        base = subprocess.run(
            ["bash", str(LOCAL_BASE)], capture_output=True, text=True, check=True
        ).stdout.splitlines()[-1]
    reused = "is up to date" in r.stderr
    layers = _layers(name)
    return Image(name, info["OCIv1"]["config"], layers, len(_layers(base)), seconds, reused)


@pytest.fixture(scope="module")
def rootfs(image: Image) -> Iterator[Path]:
    """The image's root filesystem: a buildah working container, mounted; removed after (and
    before: the one an interrupted run left would keep the image it was made from)."""
    # one per checkout, so that two checkouts' runs on one machine keep to their own
    container = f"nexus-admit-e2e-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}"
    subprocess.run(["buildah", "rm", container], capture_output=True, check=False)
    _buildah("from", "--pull-never", "--name", container, image.name)
    try:
        yield Path(_buildah("mount", container))
    finally:
        subprocess.run(["buildah", "rm", container], capture_output=True, check=False)


def _in_image(root: Path, image: Image, *argv: str) -> subprocess.CompletedProcess[str]:
    """argv run in the image's root, as its user, with its environment only."""
    return subprocess.run(
        [
            *("env", "-i", *image.config.get("Env", [])),
            *(shutil.which("chroot") or "chroot", f"--userspec={image.config['User']}", str(root)),
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_image_holds_no_build_tool_or_test_dependency(image: Image, rootfs: Path) -> None:
    path = next(e for e in image.config["Env"] if e.startswith("PATH=")).removeprefix("PATH=")
    found = [
        f"{d}/{name}"
        for d in path.split(":")
        for name in FORBIDDEN_EXECUTABLES
        if (rootfs / d.lstrip("/") / name).exists()
    ]
    assert not found, f"build or test tools in the image: {found}"

    listed = _in_image(
        rootfs,
        image,
        "python",
        "-c",
        "import importlib.metadata as m, json;"
        "print(json.dumps(sorted(d.metadata['Name'].lower() for d in m.distributions())))",
    )
    assert listed.returncode == 0, listed.stderr
    installed = set(json.loads(listed.stdout))
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    test_only = {
        re.split(r"[\[<>=~! ;]", r, maxsplit=1)[0].lower()
        for r in dev["dev"] + dev["report"]
        if not r.startswith("nexus-admit")
    } - set(RUNTIME_TOO)
    assert "nexus-admit" in installed and "kopf" in installed, installed
    assert not installed & test_only, (
        f"test or report dependencies in the image: {installed & test_only}"
    )

    total = sum(image.layer_bytes)
    base = sum(image.layer_bytes[: image.base_layer_count])
    report = {
        "image": image.name,
        "base": BASE,
        "size_bytes": total,
        "size_mib": round(total / 2**20, 1),
        "base_size_mib": round(base / 2**20, 1),
        "added_mib": round((total - base) / 2**20, 1),
        "layers": len(image.layer_bytes),
        "build_seconds": round(image.build_seconds, 1),
        "reused": image.reused,
        "python_distributions": len(installed),
    }
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n[image] {json.dumps(report)} -> {REPORT.relative_to(ROOT)}")


class ImageController(NexusController):
    """`nexus-admit run` from the image: its ENTRYPOINT and CMD, the flags NexusController
    gives the host controller (paths moved into the image), as the image's USER, with the
    image's environment only, chrooted into its root filesystem. /proc and /dev are mounted
    in a mount namespace of its own (as a container runtime would); the network is the
    host's, so the webhook on 127.0.0.1 is where the apiserver expects it. Every step
    execs the next: the process started is the controller (stop() signals it)."""

    def __init__(self, cluster: Any, image: Image, root: Path) -> None:
        super().__init__(cluster, name="nexus-admit-image")
        self.image = image
        self.root = root

    def _install_files(self) -> dict[str, str]:
        crt, key = self.ensure_cert()
        uid, gid = (int(x) for x in self.image.config["User"].split(":"))
        inside = {
            str(self.cluster.kubeconfig): f"{CONFIG_DIR}/kubeconfig",
            str(crt): f"{CONFIG_DIR}/webhook/tls.crt",
            str(key): f"{CONFIG_DIR}/webhook/tls.key",
        }
        for host, path in inside.items():
            target = self.root / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(host, target)
            target.chmod(0o400)
            for p in (target, target.parent, target.parent.parent):
                os.chown(p, uid, gid)
        return inside

    def argv(self) -> list[str]:
        inside = self._install_files()
        host_argv = super().argv()
        assert host_argv[1] == "run"
        flags = []
        for flag in host_argv[2:]:
            name, eq, value = flag.partition("=")
            flags.append(f"{name}={inside.get(value, value)}" if eq else flag)
        config = self.image.config
        root = str(self.root)
        mounts = 'mount -t proc proc "$0/proc" && mount --rbind /dev "$0/dev" && exec "$@"'
        return [
            *(shutil.which("unshare") or "unshare", "--mount", "--", "sh", "-c", mounts, root),
            *(shutil.which("env") or "env", "-i", *config.get("Env", [])),
            *(shutil.which("chroot") or "chroot", f"--userspec={config['User']}", root),
            *config["Entrypoint"],
            *config["Cmd"],
            *flags,
        ]


@pytest.fixture(scope="module")
def image_controller(e2e_cluster: Any, image: Image, rootfs: Path) -> Iterator[ImageController]:
    nc = ImageController(e2e_cluster, image, rootfs)
    nc.install()
    try:
        nc.start()
        yield nc
    finally:
        nc.stop()
        nc.uninstall_webhook()


def test_the_image_runs_as_non_root_and_places_a_gang(
    image: Image,
    image_controller: ImageController,
    e2e_namespace: str,
    core_v1,
    batch_v1,
    custom_objects,
) -> None:
    config = image.config
    assert config["Entrypoint"] == ["nexus-admit"] and config["Cmd"] == ["run"], config
    uid = int(config["User"].split(":")[0])
    assert uid != 0, "the image's USER is not root"
    assert image_controller.proc is not None
    pid = image_controller.proc.pid
    status = Path(f"/proc/{pid}/status").read_text()
    uids = re.search(r"^Uid:\s+(.*)$", status, flags=re.M)
    assert uids and set(uids.group(1).split()) == {str(uid)}, status
    assert os.readlink(f"/proc/{pid}/root") == str(image_controller.root)
    assert "nexus-admit" in Path(f"/proc/{pid}/cmdline").read_text()

    ns = e2e_namespace
    create_local_queue(custom_objects, ns, "nexus-gold", "nexus-gold")
    batch_v1.create_namespaced_job(ns, job("train", "nexus-gold", pods=4, gpus=8))
    wl = wait_check(custom_objects, ns, "train", ("Ready",))
    assert "placed 4 pods" in check_entry(wl)["message"], check_entry(wl)
    slots = slots_of(reservation_of(custom_objects, ns, wl))
    pods = wait_for("4 pods Running", lambda: running(core_v1, ns, "train", 4), timeout=120)
    for p in pods:
        slot = p.metadata.annotations[SLOT]
        index = p.metadata.labels.get(INDEX) or p.metadata.annotations[INDEX]
        assert slot == f"main/{index}", (p.metadata.name, slot)
        assert p.spec.node_name == slots[slot]["node"], "bound to the reserved node"
    assert "placed 4 pods" in image_controller.log_tail(400), "the image's controller placed it"
