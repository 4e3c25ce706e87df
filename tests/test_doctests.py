"""Tier 1: the worked examples in the docstrings of every module of the packages run as written.

The modules are found, not listed: every module of ``collectives``, ``ring``, ``trainer``, ``bench``
and ``cmdline`` whose source holds an example (``>>>``). One is skipped only where its import needs
a package of an extra that is not installed (``OPTIONAL``: torch, cupy), and the skip says which.
Importing some modules starts MPI in this process, as a singleton (``ring.transport.mpi``, the bench):
their examples need no other rank."""
import doctest
import importlib
from pathlib import Path

import numpy as np
import pytest

PACKAGES = ("collectives", "ring", "trainer", "bench", "cmdline")
ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = ("torch", "cupy")   # (the extras' packages a module may need at import)


def modules_with_examples() -> list[str]:
    """Every module of PACKAGES whose source holds an example, found from the files alone."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if ">>> " in path.read_text():
                found.append(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"))
    return found


@pytest.mark.parametrize("name", modules_with_examples())
def test_the_examples_in_a_modules_docstrings_hold(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs {e.name}, which is not installed")
        raise
    examples = sum(len(test.examples) for test in doctest.DocTestFinder().find(module))
    assert examples > 0, f"{name}: its '>>> ' is in no docstring, so no example runs"
    result = doctest.testmod(module, extraglobs={"np": np}, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (see above)"
