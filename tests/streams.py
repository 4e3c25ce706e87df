"""How ``python -m pytest -n N`` (pytest-xdist, as the README runs the suite: ``-n 2``) deals the
suite out to N streams, each a pytest process of its own.

Run in one stream, the suite leaves a third of this machine's two cores idle: much of its time goes
to timeouts and deaths the tests provoke, and to launches. So the tests go out a few at a time to
whichever stream has two or fewer left to run, but for the files of ``ONE_STREAM``: each group there
runs in one stream, in collection order, as it would serially. Groups go out first, the largest
(most tests) first, so that none is left to run alone at the end. For instance::

    tests/test_hosts.py::test_x        -> "network-namespaces"   (with tests/test_slurm.py's tests)
    tests/test_torch_suite.py::test_y  -> "tests/test_torch_suite.py"
    tests/test_faults.py::test_z       -> "tests/test_faults.py::test_z"   (a unit of its own)

(pytest-xdist's own ``--dist loadgroup`` and its ``xdist_group`` mark would say the same from the
test files, but under pytest 9.2 the mark no longer reaches the scheduler: pytest-xdist issue 1386.)
"""
from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

NAMESPACES = "network-namespaces"

#: The files whose tests run in one stream, in order: the group each joins.
ONE_STREAM = {
    # They make network namespaces, whose names, /etc/netns/ and /run/netns/ are the machine's, and
    # each module's fixture brings its hosts or its cluster up and down.
    "tests/test_hosts.py": NAMESPACES,
    "tests/test_hosts_openmpi.py": NAMESPACES,
    "tests/test_elastic_growth.py": NAMESPACES,
    "tests/test_slurm.py": NAMESPACES,
    # Every test uses the module's fixtures: the zygote that serves PyTorch's suite; the worlds of
    # the torch fault scenarios.
    "tests/test_torch_suite.py": "tests/test_torch_suite.py",
    "tests/test_torch_faults.py": "tests/test_torch_faults.py",
}


def unit_of(nodeid: str) -> str:
    """The unit of work a test goes out in: its file's group, or the test alone."""
    return ONE_STREAM.get(nodeid.split("::")[0], nodeid)


class ByGroup(LoadScopeScheduling):
    """pytest-xdist's scheduling by scope (a scope's tests go to one stream together; scopes with
    more tests go first), with ``unit_of`` as the scope (``_split_scope`` is where pytest-xdist's own
    schedulings by file and by group differ from it, too)."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)
