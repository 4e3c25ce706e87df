"""Tier 2 launcher: runs tests/mpi in real MPI worlds of 1 to 4 ranks (odd and even, and more ranks
than this machine's 2 cores), each world bounded in time. Every algorithm of every collective at 5
to 64 ranks runs in tests/test_simulated_ring.py (the real algorithms and executor, ranks as threads).

Each test of a world is reported as a test of its own, with the ranks it failed on
(tests/world_outcomes.py), e.g. ``test_collectives_in_a_real_world[3]::tests/mpi/test_api.py::test_x``;
the test that launched the world fails only if the world did not end as a pytest run ends (a rank
died, or the world was killed at its bound), with the tail of the world's output.
"""
import pytest

#: The quick worlds' share of tests/mpi: every collective against mpi4py's own, and the API around them.
QUICK_FILES = ["tests/mpi/test_collectives.py", "tests/mpi/test_api.py", "tests/mpi/test_usage_errors.py"]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_collectives_in_a_real_world(n, world_tests):
    world_tests(n, ["tests/mpi"])


@pytest.mark.quick
@pytest.mark.parametrize("n", [2, 3])   # (an odd size finds what an even one hides)
def test_a_few_collectives_in_a_small_world(n, world_tests):
    world_tests(n, QUICK_FILES)


def test_only_shared_memory_no_process_maps_and_older_than_a_world_start_is_removed(tmp_path):
    """MPICH's and Open MPI's segments a killed world leaves in /dev/shm are removed after each test
    (tests/worlds.py): an old one nobody maps goes; one a process maps, or a new one, stays."""
    # (in a directory of its own: the other test stream removes /dev/shm's orphans after each of its tests)
    import mmap
    import os
    import time

    from tests.worlds import ORPHAN_AGE_S, remove_orphan_segments
    orphan, in_use, new = (tmp_path / f"mpich_shm_test_{kind}" for kind in ("orphan", "mapped", "new"))
    open_mpis = tmp_path / "sm_segment.vm.0.2f030000.0"
    long_ago = time.time() - 2 * ORPHAN_AGE_S
    for path in (orphan, in_use, new, open_mpis):
        path.write_bytes(b"\0" * 4096)
    for path in (orphan, in_use, open_mpis):
        os.utime(path, (long_ago, long_ago))
    with open(in_use, "r+b") as f, mmap.mmap(f.fileno(), 4096) as mapped:
        removed = remove_orphan_segments(directory=tmp_path)
        assert sorted(removed) == sorted([orphan, open_mpis]) and not orphan.exists() and not open_mpis.exists()
        assert in_use.exists() and new.exists() and mapped[0] == 0
