"""Tier 1: who started the process, read from each launcher's environment (the variables as srun,
hydra and prterun set them, measured on the emulated Slurm cluster: scripts/emulate_slurm.sh), and
the refusal of a world of 1 where srun started several tasks (tests/test_slurm.py runs it for real)."""
from types import SimpleNamespace

import pytest

from collectives import CollectiveUsageError
from collectives.process.launchers import launcher, refuse_lone_srun_task, slurm_job

def mpi(size: int, library: str = "MPICH Version: 5.0.2") -> SimpleNamespace:
    """What refuse_lone_srun_task asks of mpi4py's MPI: the world's size and the library."""
    return SimpleNamespace(COMM_WORLD=SimpleNamespace(Get_size=lambda: size), Get_library_version=lambda: library)


SRUN_PMI2 = {"SLURM_JOB_ID": "24", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4",
             "SLURM_MPI_TYPE": "pmi2", "PMI_FD": "11", "PMI_SIZE": "4", "PMI_RANK": "2", "PMI_JOBID": "24.0",
             "SLURM_JOB_NODELIST": "slurmn[1-2]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
SRUN_NONE = {k: v for k, v in SRUN_PMI2.items() if not k.startswith("PMI")} | {"SLURM_MPI_TYPE": "none"}
# mpiexec (hydra) inside salloc -N2 -n4: the SLURM_* of the step that started its 2 proxies
HYDRA_IN_SALLOC = {"SLURM_JOB_ID": "25", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2",
                   "SLURM_EXTERNAL_LAUNCHER": "1", "PMI_FD": "5", "PMI_SIZE": "4", "PMI_RANK": "2",
                   "MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "0", "SLURM_JOB_NODELIST": "slurmn[1-2]"}
PRTERUN_IN_SALLOC = {"SLURM_JOB_ID": "26", "SLURM_STEP_NUM_TASKS": "2", "OMPI_COMM_WORLD_SIZE": "4"}


@pytest.mark.parametrize("environment, expected", [
    (SRUN_PMI2, ("Slurm's srun --mpi=pmi2", "SLURM_STEP_NUM_TASKS", "4")),
    (SRUN_NONE, ("Slurm's srun --mpi=none", "SLURM_STEP_NUM_TASKS", "4")),
    (HYDRA_IN_SALLOC, ("MPICH's or Intel MPI's mpiexec", "PMI_SIZE", "4")),
    (PRTERUN_IN_SALLOC, ("Open MPI's mpirun", "OMPI_COMM_WORLD_SIZE", "4")),
    ({}, None),
])
def test_the_launcher_is_the_one_that_started_mpi(environment, expected):
    assert launcher(environment) == expected


def test_the_slurm_job_is_named_with_its_nodes_tasks_and_pmi():
    assert slurm_job(SRUN_PMI2) == "Slurm job 24 step 0 on slurmn[1-2], tasks per node 2(x2), PMI pmi2"
    assert slurm_job(HYDRA_IN_SALLOC) == "Slurm job 25 step 0 on slurmn[1-2]"   # (its proxies' step: not MPI's)
    assert slurm_job({}) == ""


@pytest.mark.parametrize("library, flag", [("MPICH Version: 5.0.2", "--mpi=pmi2"), ("Open MPI v5.0.11", "--mpi=pmix")])
def test_a_world_of_one_of_several_srun_tasks_is_refused_naming_the_flag(library, flag):
    with pytest.raises(CollectiveUsageError, match=rf"srun started 4 tasks \(SLURM_STEP_NUM_TASKS=4\), but MPI sees a "
                                                   rf"world of 1 rank in each: srun --mpi=none gave MPI no way to find "
                                                   rf"the others; .* launch with srun {flag}"):
        refuse_lone_srun_task(mpi(1, library), SRUN_NONE)


@pytest.mark.parametrize("size, environment", [(4, SRUN_PMI2), (1, {**SRUN_PMI2, "SLURM_STEP_NUM_TASKS": "1"}),
                                               (1, HYDRA_IN_SALLOC), (1, {})])
def test_a_world_as_large_as_its_launch_or_another_launcher_is_let_be(size, environment):
    refuse_lone_srun_task(mpi(size), environment)
