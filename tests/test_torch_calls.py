"""Tier 2: scripts/torch_calls.py, run as its docstring says at n=2 on tiny sizes: the table's shape.

Its timings are shown, never asserted (the shared machine's speed is noise); what is checked is
that every collective and size has its row, with positive times, the col reference where asked
for, and a verdict that is one of the target's (no error, ring and gloo agreeing).
"""
import importlib.util
import math

import pytest

from tests.worlds import run_world

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason='needs torch (pip install -e ".[torch]")')

TIMEOUT_S = 240
COLLECTIVES = ["all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single",
               "gather", "scatter", "reduce", "barrier"]
VERDICTS = ("ok", "slower than gloo", "over 2x col + 20 us")


def rows_of(stdout: str) -> list[list[str]]:
    """The table's rows, each as its fields (the verdict, which has spaces, as the last)."""
    lines = stdout.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("collective ")))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        rows.append(line.split(None, 6))
    return rows


@pytest.mark.parametrize("flags,sizes,col_sizes", [(["--sizes", "8,1K", "--col-max", "8"], ["8", "1K"], ["8"]),
                                                   (["--sizes", "8", "--async"], ["8"], ["8"])],
                         ids=["sync", "async"])
def test_the_table_has_a_row_per_collective_and_size_with_positive_times(flags, sizes, col_sizes):
    result = run_world(2, ["scripts/torch_calls.py", *flags, "--repeats", "2", "--warmup", "1"], TIMEOUT_S)
    out = result.stdout
    assert result.returncode == 0, out[-4000:]
    assert out.count("# target: ring no slower than gloo") == 1 and out.count("\ncollective ") == 1, out[-3000:]
    assert ("async_op=True, then wait()" in out) == ("--async" in flags)
    rows = rows_of(out)
    expected = [(c, s) for c in COLLECTIVES for s in (["-"] if c == "barrier" else sizes)]
    assert [(r[0], r[1]) for r in rows] == expected, out[-3000:]
    for row in rows:
        assert len(row) == 7, row
        ring_us, gloo_us, ratio = map(float, row[2:5])
        assert ring_us > 0 and gloo_us > 0 and math.isclose(ratio, ring_us / gloo_us, rel_tol=0.02, abs_tol=0.01), row
        timed_col = row[1] in col_sizes or row[0] == "barrier"
        assert (row[5] != "-") == timed_col and (not timed_col or float(row[5]) > 0), row
        assert all(part.startswith(VERDICTS) for part in row[6].split("; ")), row
    assert out.count("# ring no slower than gloo: ") == 1 and "rows WRONG or failed" not in out
