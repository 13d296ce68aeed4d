"""Where the simulator reads its traces from.

By default, the copy shipped inside the package (`nexus_admit/data/`, gzip-compressed CSV;
sources and licences in its README.md). `$NEXUS_ADMIT_DATA` or `--data` name another
directory with the same layout (`openb/…`, `lingjun/topo.csv`), holding plain `.csv` or
`.csv.gz` files. `simulate --pods/--nodes-file` read single files (`open_text`).
"""

from __future__ import annotations

import gzip
import os
from importlib import resources
from pathlib import Path
from typing import TextIO

__all__ = ["DATA_ENV", "csv_path", "default_data", "open_csv", "open_text", "packaged_data"]

DATA_ENV = "NEXUS_ADMIT_DATA"


def packaged_data() -> Path:
    """The data directory shipped inside the package."""
    root = resources.files("nexus_admit").joinpath("data")
    # The wheel installs as plain files, so the resource root is a real directory; a
    # zipped install would need extracting first, which nothing here does.
    if not isinstance(root, Path) or not root.is_dir():
        raise FileNotFoundError(f"nexus_admit/data is missing from the installed package ({root})")
    return root


def default_data() -> Path:
    """`$NEXUS_ADMIT_DATA` when set, else the packaged data."""
    override = os.environ.get(DATA_ENV)
    return Path(override) if override else packaged_data()


def csv_path(data: Path, relative: str) -> Path | None:
    """The file `data/relative` (a `.csv` name) or its `.gz` twin, whichever exists."""
    for candidate in (Path(data) / relative, Path(data) / f"{relative}.gz"):
        if candidate.is_file():
            return candidate
    return None


def open_csv(data: Path, relative: str) -> TextIO:
    """Open `data/relative` as text for `csv.DictReader`, plain or gzip-compressed."""
    path = csv_path(data, relative)
    if path is None:
        raise FileNotFoundError(f"{Path(data) / relative} not found (nor its .gz)")
    return open_text(path)


def open_text(path: Path) -> TextIO:
    """Open a CSV file as text for `csv.DictReader`, gzip-compressed when it ends in .gz."""
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="", encoding="utf-8")
    return open(path, newline="", encoding="utf-8")
