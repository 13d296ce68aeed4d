"""The plane's state directory: its paths, cluster.json (ports, PIDs, argv, timings), the
components' logs and the lock that serialises up/down on it across processes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plane.environment import build_binaries


class StateFiles:
    """Where a plane keeps its files; the other parts of Cluster build on it."""

    state: Path
    _bin: Path | None
    _lock_depth: int

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs_dir(self) -> Path:
        return self.state / "logs"

    @property
    def config_dir(self) -> Path:
        return self.state / "config"

    @property
    def info_file(self) -> Path:
        return self.state / "cluster.json"

    def info(self) -> dict[str, Any]:
        try:
            return json.loads(self.info_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def _save_info(self, info: dict[str, Any]) -> None:
        tmp = self.info_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        tmp.replace(self.info_file)

    @property
    def bin(self) -> Path:
        if self._bin is None:
            recorded = self.info().get("bin")
            self._bin = Path(recorded) if recorded else build_binaries()
        return self._bin

    def log_tail(self, name: str, lines: int = 40) -> str:
        f = self.logs_dir / f"{name}.log"
        if not f.exists():
            return ""
        with open(f, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read().decode(errors="replace").splitlines()
        return "\n".join(data[-lines:])

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Serialise up/down on one state directory across processes (flock in $TMPDIR)."""
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        import fcntl

        digest = hashlib.sha256(str(self.state).encode()).hexdigest()[:16]
        lock = Path(tempfile.gettempdir()) / f"nexus-e2e-{digest}.lock"
        with open(lock, "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            self._lock_depth = 1
            try:
                yield
            finally:
                self._lock_depth = 0
                fcntl.flock(fh, fcntl.LOCK_UN)
