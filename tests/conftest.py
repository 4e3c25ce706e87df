"""tests/mpi runs only inside MPI worlds (launched by tests/test_worlds.py with --with-mpi)."""
from pathlib import Path

MPI_TESTS = Path(__file__).parent / "mpi"


def pytest_ignore_collect(collection_path, config):
    if not config.getoption("--with-mpi", default=False):
        return Path(collection_path).is_relative_to(MPI_TESTS) or None
    return None
