"""torch.distributed's gloo beside the ring and MPI: the bench's ``gloo`` column.

Its process group spans the bench's ranks. The rendezvous is torch's TCP store on a port that
rank 0 picks and sends to the others over MPI (127.0.0.1 when every rank is on rank 0's host,
rank 0's host name otherwise). The calls work on torch views of the bench's own numpy buffers
(``torch.from_numpy``: no copy), so all the implementations move the same bytes:

    allreduce       dist.all_reduce(out)              in place: ``out`` gets the input before the clock
    reduce_scatter  dist.reduce_scatter_single(out, x)    (reduce_scatter_tensor in older torch)
    allgather       dist.all_gather_single(out, x)        (all_gather_into_tensor in older torch)
    broadcast       dist.broadcast(x, src=root)

``avg`` is a sum and one division, timed, as in the MPI column. gloo has no 16-bit integers and no
unsigned integers wider than 8 bits. torch is optional (``pip install -e ".[torch]"``): where it
is missing, ``missing`` says so and the bench leaves the column out with a note.
"""
from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

import collectives as col

#: The numpy dtypes gloo reduces and moves (it refuses int16, uint16, uint32 and uint64).
SUPPORTED = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64")
INSTALL = 'pip install -e ".[torch]"'


def missing(dtype: str) -> str | None:
    """Why gloo cannot be timed here on ``dtype`` (None when it can): torch absent or without
    gloo, or a dtype gloo refuses."""
    try:
        import torch.distributed as dist
    except ImportError as e:
        return f"torch is not installed ({e}; {INSTALL})"
    if not (dist.is_available() and dist.is_gloo_available()):
        return "this torch was built without torch.distributed's gloo"
    if dtype not in SUPPORTED:
        return f"gloo has no {dtype}"
    return None


class Gloo:
    """A gloo process group over the ranks of ``comm`` (torch's default group), and the
    functions the bench calls on it.

    >>> gloo = Gloo(MPI.COMM_WORLD)         # doctest: +SKIP
    >>> gloo.close()                         # doctest: +SKIP
    """

    def __init__(self, comm: MPI.Comm, timeout_s: float | None = None):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        if col.about.launchers.torch_launched():   # (torchrun: torch's tcp:// would wait on its agent's store)
            self.address = "env://"
        else:
            one_host = len(set(comm.allgather(MPI.Get_processor_name()))) == 1
            host, port = comm.bcast(_listening_address(one_host) if comm.Get_rank() == 0 else None)
            self.address = f"tcp://{host}:{port}"
        timeout = timedelta(seconds=timeout_s if timeout_s is not None else col.settings().timeout)
        dist.init_process_group("gloo", init_method=self.address, rank=comm.Get_rank(),
                                world_size=comm.Get_size(), timeout=timeout)
        self.version = torch.__version__
        self.all_reduce, self.broadcast = dist.all_reduce, dist.broadcast
        self.reduce_scatter = _newest(dist, "reduce_scatter_single", "reduce_scatter_tensor")
        self.all_gather = _newest(dist, "all_gather_single", "all_gather_into_tensor")
        self.ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
                    "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}

    def tensor(self, array: np.ndarray) -> Any:
        """A torch tensor sharing ``array``'s memory."""
        return self.torch.from_numpy(array)

    def describe(self) -> str:
        """One line for the bench's header."""
        return (f"gloo: torch {self.version}'s ProcessGroupGloo over {self.address}, on views of the same "
                f"buffers; {self.reduce_scatter.__name__}, {self.all_gather.__name__}, all_reduce in place "
                "(the input copied in before the clock starts), avg = sum then one division")

    def close(self) -> None:
        """Leave the process group (every rank)."""
        self.dist.destroy_process_group()


def _listening_address(one_host: bool) -> tuple[str, int]:
    """Rank 0's address for the store and a port free on it now."""
    host = "127.0.0.1" if one_host else socket.gethostname()
    with socket.socket() as s:
        s.bind((host if one_host else "", 0))
        return host, s.getsockname()[1]


def _newest(dist: Any, name: str, older: str) -> Callable:
    """torch's current name for a call, or the one older versions have."""
    return getattr(dist, name, None) or getattr(dist, older)
