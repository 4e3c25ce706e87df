"""Tier 1, issue 26's budget of Python calls per small call, counted (not timed) at n=1, where nothing waits
and the counts are the same on every run: ``scripts/call_budget.py`` exits 1 past a budget."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_collective_keeps_its_budget_of_python_calls():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "call_budget.py"), "--no-valgrind"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "OVER BUDGET" not in result.stdout, result.stdout + result.stderr[-2000:]
    assert "  allreduce_many " in result.stdout and "  reduce_scatter " in result.stdout, result.stdout
