"""The worked examples in the docstrings of the modules that need no MPI run as written."""
import doctest
import importlib
import importlib.util

import numpy as np
import pytest

MODULES = ["ring.partition", "ring.schedule", "ring.personalized", "ring.doubling", "ring.cost", "ring.arrays", "collectives.calls.signature",
           "collectives.calls.sizes", "collectives.calls.validate", "collectives.groups.membership", "collectives.process.runtime", "collectives.process.config",
           "collectives.api", "collectives.calls.timeline", "trainer.model", "trainer.optim",
           "trainer.buckets", "trainer.strategies.ps", "trainer.strategies.periodic",
           "trainer.strategies.local_sgd", "trainer.strategies.diloco", "trainer.compression", "trainer.strategies.allreduce", "trainer.checkpoint", "trainer.resuming", "trainer.shards", "bench.sizes", "bench.model", "collectives.about", "cmdline.interrupt", "cmdline.cores", "collectives.process.launchers",
           "collectives.process.launch_environment", "collectives.process.supervision", "collectives.process.ending",
           "collectives.process.life", "collectives.process.changes",
           "ring.transport.base", "ring.transport.mpi.departures", "ring.reproducible", "ring.compression", "collectives.ops.reproducible"]
MODULES += ["collectives.torch.tensors"] if importlib.util.find_spec("torch") else []   # (the extra [torch])


@pytest.mark.parametrize("name", MODULES)
def test_the_examples_in_a_modules_docstrings_hold(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, extraglobs={"np": np}, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples to run"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (see above)"
