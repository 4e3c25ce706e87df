"""Tier 2: DDP's communication hooks (fp16_compress_hook, bf16_compress_hook, powerSGD_hook,
batched_powerSGD_hook) on the "ring" backend against gloo, in real worlds of 1, 2 and 3 ranks
(``tests/programs/torch_comm_hooks.py``, whose docstring states each relation checked: equal to
gloo at n <= 2, a stated tolerance at n = 3 where the sums round differently, identical replicas
after every step, and each compressed sum against the exact one)."""
import re

import pytest

from tests.worlds import run_world

pytest.importorskip("torch")
BOUND_S = 300   # (3 ranks on 2 cores, each hook trained on both backends: about 10 s a world here)
HOOKS = ["fp16", "bf16", "powerSGD", "batched_powerSGD"]


def expected_checks(n: int) -> set[str]:
    checks = {f"{hook} {what}" for hook in HOOKS for what in ("replicas", "gloo")}
    if n > 1:
        checks |= {f"{hook} sums" for hook in ("fp16", "bf16")} | {"bf16 sums-once"}
    if n == 2:
        checks |= {"fp16 sums-gloo", "bf16 sums-gloo"}
    return checks


@pytest.mark.parametrize("n", [1, 2, 3])
def test_each_hook_trains_on_ring_as_on_gloo(n):
    result = run_world(n, ["-m", "tests.programs.torch_comm_hooks"], BOUND_S, env={"COLLECTIVES_TIMEOUT": "60"})
    out = result.stdout
    verdicts = dict(re.findall(r"^CHECK (\S+ \S+): (.*)$", out, re.MULTILINE))
    failed = {check: verdict for check, verdict in verdicts.items() if verdict != "ok"}
    assert result.returncode == 0 and not failed, (failed, out[-4000:])
    assert set(verdicts) == expected_checks(n), out[-4000:]
