"""Tier 1: settings read from the environment and init's keywords (no MPI)."""
import pytest

from collectives.calls import config as world
from collectives.calls import validate


@pytest.mark.parametrize("raw, expected", [("4M", 4 << 20), ("64K", 64 << 10), ("4194304", 4 << 20), ("1G", 1 << 30)])
def test_byte_counts_take_the_bench_size_syntax(monkeypatch, raw, expected):
    monkeypatch.setenv("COLLECTIVES_SEGMENT_BYTES", raw)
    settings, problem = world.read({}, from_environment=True)
    assert problem == "" and settings["segment_bytes"] == expected


@pytest.mark.parametrize("variable, raw, expected", [
    ("COLLECTIVES_SEGMENT_BYTES", "2G", "COLLECTIVES_SEGMENT_BYTES: expected a byte count from 0 (the defaults) to 1073741824"),
    ("COLLECTIVES_SEGMENT_BYTES", "lots", "COLLECTIVES_SEGMENT_BYTES: expected a byte count"),
    ("COLLECTIVES_SMALL_BYTES", "512K", "COLLECTIVES_SMALL_BYTES: expected a byte count from 0 to 262144"),
    ("COLLECTIVES_CHECK", "yes", "COLLECTIVES_CHECK: expected True/False (environment: 1 or 0)"),
    ("COLLECTIVES_TIMEOUT", "0", "COLLECTIVES_TIMEOUT: expected a positive number of seconds"),
    ("COLLECTIVES_TIMEOUT", "nan", "COLLECTIVES_TIMEOUT: expected a positive number of seconds"),
    ("COLLECTIVES_GPU_TRANSPORT", "fast", "COLLECTIVES_GPU_TRANSPORT: expected"),
])
def test_a_bad_setting_is_a_problem_to_share_not_an_exception(monkeypatch, variable, raw, expected):
    monkeypatch.setenv(variable, raw)
    settings, problem = world.read({}, from_environment=True)   # the others must hear of it
    assert problem.startswith(f"init: {expected}"), problem


def test_keywords_override_the_environment_and_are_checked(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_SEGMENT_BYTES", "64K")
    settings, problem = world.read({"segment_bytes": 1 << 20}, from_environment=True)
    assert problem == "" and settings["segment_bytes"] == 1 << 20
    _, problem = world.read({"segment_bytes": True}, from_environment=True)
    assert problem.startswith("init: segment_bytes: expected a byte count"), problem


@pytest.mark.parametrize("raw", ["inf", "1e12", "1e300"])
def test_an_infinite_or_huge_timeout_means_no_bound(monkeypatch, raw):
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", raw)
    settings, problem = world.read({}, from_environment=True)
    assert problem == "" and settings["timeout"] == float(raw)
    assert validate.bounded(settings["timeout"]) is None   # what threading's waits take for "no bound"
