"""Launches the planted tests (tests/programs/planted_world_tests.py) in worlds of 2, as
tests/test_worlds.py launches tests/mpi; run by tests/test_world_outcomes.py in a pytest of its own,
whose report of each planted test it checks. Not collected by the suite itself (its name has no test_)."""
PLANTED = ["tests/programs/planted_world_tests.py"]
BOUND_S = 10   # the hanging world's time bound (its other tests take a few seconds)


def test_a_world_with_a_failure_on_one_rank(world_tests):
    world_tests(2, PLANTED)


def test_a_world_where_a_rank_dies(world_tests):
    world_tests(2, PLANTED, env={"PLANTED_FAULT": "death"})


def test_a_world_where_a_rank_hangs(world_tests):
    world_tests(2, PLANTED, env={"PLANTED_FAULT": "hang"}, timeout=BOUND_S)
