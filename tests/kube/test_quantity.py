from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nexus_admit.kube.quantity import (
    format_quantity,
    parse_count,
    parse_cpu_milli,
    parse_memory_mib,
    parse_milli,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        ("1.5", Fraction(3, 2)),
        ("40Gi", Fraction(40 * 2**30)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("1G", Fraction(10**9)),
        ("1e3", Fraction(1000)),
        ("1E3", Fraction(1000)),
        ("2E", Fraction(2 * 10**18)),
        ("100k", Fraction(100_000)),
        ("250u", Fraction(250, 10**6)),
        ("+3", Fraction(3)),
        ("-1", Fraction(-1)),
        (".5", Fraction(1, 2)),
        (" 4 ", Fraction(4)),
        (8, Fraction(8)),
        (0.25, Fraction(1, 4)),
    ],
)
def test_parse_quantity(text: str | int | float, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["", "abc", "40GB", "1.2.3", "Gi", "5 Gi", "1e", "0x10", "1Mi2"])
def test_parse_quantity_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(bad)


def test_parse_quantity_rejects_non_numbers() -> None:
    with pytest.raises(ValueError):
        parse_quantity(True)
    with pytest.raises(ValueError):
        parse_quantity(float("nan"))


def test_unit_helpers_round_up() -> None:
    assert parse_cpu_milli("500m") == 500
    assert parse_cpu_milli("2") == 2000
    assert parse_cpu_milli("0.0001") == 1
    assert parse_memory_mib("40Gi") == 40960
    assert parse_memory_mib("1G") == 954  # 953.67 rounded up
    assert parse_memory_mib("1") == 1
    assert parse_milli("0.5") == 500
    assert parse_milli("250m") == 250
    assert parse_count("8") == 8
    with pytest.raises(ValueError, match="whole number"):
        parse_count("1.5")


@given(st.integers(min_value=0, max_value=10**9))
def test_milli_round_trip(milli: int) -> None:
    assert parse_milli(format_quantity(milli)) == milli
    assert parse_cpu_milli(f"{milli}m") == milli


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from(["Ki", "Mi", "Gi", "Ti"]),
)
def test_binary_suffix_round_trip(n: int, suffix: str) -> None:
    factor = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[suffix]
    assert parse_quantity(f"{n}{suffix}") == n * factor
    assert parse_memory_mib(f"{n}{suffix}") == -(-n * factor // 2**20)


@given(st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False))
def test_decimal_strings(d: object) -> None:
    text = str(d)
    assert parse_quantity(text) == Fraction(text)
