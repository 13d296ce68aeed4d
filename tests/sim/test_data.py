"""The packaged data and the data-directory override: the shipped files are the ones the
data README lists (same bytes), and another directory may hold plain or gzipped CSV."""

from __future__ import annotations

import gzip
import hashlib
import re
import shutil
from pathlib import Path

import pytest

from nexus_admit.sim import openb
from nexus_admit.sim import replay as rp
from nexus_admit.sim.data import DATA_ENV, csv_path, default_data, open_csv, packaged_data

PACKAGED = packaged_data()


def test_the_packaged_data_lives_in_the_package() -> None:
    assert PACKAGED.resolve() == Path(openb.__file__).resolve().parents[1] / "data"


def test_every_packaged_file_matches_its_checksum_in_the_data_readme() -> None:
    readme = (PACKAGED / "README.md").read_text()
    listed = dict(
        re.findall(r"^\| `([\w/.]+\.csv\.gz)` \|.*`([0-9a-f]{64})` \|$", readme, re.MULTILINE)
    )
    shipped = {str(p.relative_to(PACKAGED)) for p in PACKAGED.rglob("*.csv.gz")}
    assert set(listed) == shipped
    for name, digest in listed.items():
        assert (
            hashlib.sha256(gzip.decompress((PACKAGED / name).read_bytes())).hexdigest() == digest
        ), name


def test_plain_csv_in_another_directory_is_read_too(tmp_path: Path) -> None:
    for relative in (openb.NODE_LIST, rp.FABRIC):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(PACKAGED / f"{relative}.gz") as src, open(tmp_path / relative, "wb") as dst:
            shutil.copyfileobj(src, dst)
    assert csv_path(tmp_path, rp.FABRIC) == tmp_path / rp.FABRIC
    assert len(openb.load_nodes(tmp_path)) == 1213
    assert rp.load_fabric(tmp_path) == rp.load_fabric(PACKAGED)


def test_a_missing_file_names_what_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"lingjun/topo\.csv not found \(nor its \.gz\)"):
        open_csv(tmp_path, rp.FABRIC)


def test_the_environment_variable_overrides_the_packaged_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(DATA_ENV, raising=False)
    assert default_data() == PACKAGED
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    assert default_data() == tmp_path
