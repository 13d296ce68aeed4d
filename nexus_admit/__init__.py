"""nexus-admit: a Kueue AdmissionCheck controller that places GPU gangs with one CP-SAT solve.

`__version__` is the one place the version is written: pyproject.toml reads it, `make image`
tags the image with it, `make chart` packages the chart with it, and `nexus-admit --version`
prints it (tests/test_versions.py checks that the chart's Chart.yaml agrees)."""

__version__ = "0.1.0"
