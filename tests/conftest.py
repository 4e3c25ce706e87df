"""tests/mpi runs only inside MPI worlds (launched by tests/test_worlds.py with --with-mpi); each test of a
world is reported as a test of the run that launched it (tests/world_outcomes.py)."""
import dataclasses
import re
from pathlib import Path

import pytest

from tests.world_outcomes import WORLD_OUTCOMES, WORLD_TIMEOUT_S, WorldReports, run_tests_in_world
from tests.worlds import remove_orphan_segments

MPI_TESTS = Path(__file__).parent / "mpi"


#: A test file's tier (docs/testing.md) is the first words of its docstring, "Tier 1" (one process, no
#: MPI launched), "Tier 2" (real MPI worlds) or "Tier 3" (a GPU); each of its tests gets the marker
#: ``tier1``, ``tier2`` or ``tier3`` from them, unless the test has a tier marker of its own.
TIER = re.compile(r"\s*Tier ([123])\b")
TIERS = ("tier1", "tier2", "tier3")


def pytest_itemcollected(item):
    said = TIER.match(getattr(getattr(item, "module", None), "__doc__", None) or "")
    if said and not any(item.get_closest_marker(tier) for tier in TIERS):
        item.add_marker(f"tier{said.group(1)}")


def pytest_ignore_collect(collection_path, config):
    if not config.getoption("--with-mpi", default=False):
        return Path(collection_path).is_relative_to(MPI_TESTS) or None
    return None


@pytest.fixture
def world_tests(request, tmp_path):
    """``world_tests(n, paths)``: run those tests in a world of n ranks, bounded by ``timeout`` seconds;
    fail if the world did not end as a pytest run ends; each of its tests is then reported on its own."""
    worlds = []

    def run(n: int, paths: list[str], env: dict | None = None, timeout: float = WORLD_TIMEOUT_S):
        world = run_tests_in_world(n, paths, tmp_path / f"world-{len(worlds)}-of-{n}", timeout, env)
        worlds.append(world)
        request.node.user_properties.append((WORLD_OUTCOMES, [dataclasses.asdict(o) for o in world.outcomes]))
        if world.problem is not None:
            pytest.fail(world.problem, pytrace=False)
        return world
    return run


def pytest_runtest_teardown(item, nextitem):
    """After every test, the shared memory of the worlds it killed (tests/worlds.py: remove_orphan_segments)."""
    remove_orphan_segments()


def pytest_configure(config):
    """The session that shows the reports reports each test of a world on its own (under -n: the
    controller, whose workers send it the outcomes)."""
    if not hasattr(config, "workerinput"):   # (not an xdist worker: this session shows the reports)
        config.pluginmanager.register(WorldReports(config), "world-reports")


@pytest.hookimpl(tryfirst=True, optionalhook=True)   # (ahead of pytest-xdist's own choice; none without it)
def pytest_xdist_make_scheduler(config, log):
    """Under -n N: the tests go out a few at a time, a group of files in one stream (tests/streams.py);
    another --dist than -n's own (load) is left to pytest-xdist."""
    if config.getvalue("dist") != "load":
        return None
    from tests.streams import ByGroup   # (lazy: only pytest-xdist calls this, and tests.streams needs it)
    return ByGroup(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """A quick world runs a few files of tests/mpi (tests/test_worlds.py): where the full world of the
    same size is selected too, it would only repeat some of its tests, so it is left out."""
    def worlds_of(name):
        return {item.callspec.params["n"]: item for item in items if getattr(item, "originalname", None) == name}
    full = worlds_of("test_collectives_in_a_real_world")
    repeats = [item for n, item in worlds_of("test_a_few_collectives_in_a_small_world").items() if n in full]
    if repeats:
        items[:] = [item for item in items if item not in repeats]
        config.hook.pytest_deselected(items=repeats)
