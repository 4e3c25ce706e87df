"""DDP communication hooks of the ring backend: ``reproducible_hook``.

What it makes reproducible, and what not: DDP gives its hook one bucket per rank, the gradient of
that rank's own part of the batch, so each rank is one contribution. The hook's result is their
exact sum, rounded once, divided by the number of ranks (rounded once too: ``op="avg"``), so its
bits do not depend on the algorithm (``COLLECTIVES_ALGORITHM``), the segment size, the order in
which the ranks arrive, or how the runtime splits the bucket: the same inputs give the same bits
on every rank and in every run. They do depend on the world size: each rank's contribution is a
float sum over its own samples, and 3 ranks split a batch otherwise than 4. For bits that do not,
compute a fixed number of virtual shards' gradients on each rank and pass them as a list to
``col.allreduce(shards, reproducible=True)``, as ``python -m trainer --reproducible`` does.
"""
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

import collectives as col
from collectives.torch.process_group import RingProcessGroup
from collectives.torch.tensors import as_array
from collectives.torch.work import RingWork, for_torch


def reproducible_hook(state: Any, bucket: dist.GradBucket) -> Future[torch.Tensor]:   # (DDP checks both annotations)
    """A DDP communication hook: the bucket's gradients averaged by the reproducible all-reduce
    (``col.allreduce(x, "avg", reproducible=True)``: the exact sum of every rank's bucket, divided
    by the number of ranks, rounded once), on the process group ``state`` (None: the default one),
    which must be the ring backend's. CPU tensors of float32, float64, float16 or bfloat16.

    >>> model = DistributedDataParallel(module)                            # doctest: +SKIP
    >>> model.register_comm_hook(None, collectives.torch.reproducible_hook)   # doctest: +SKIP
    """
    tensor = bucket.buffer()
    try:
        group = _ring_group(state)
        x = as_array(tensor)
        work = col.allreduce(x, "avg", out=x, reproducible=True, async_op=True, group=group,
                             name="reproducible_hook")
    except (col.CollectiveUsageError, col.CollectiveError) as error:
        raise for_torch(error) from error
    return RingWork(work, [tensor]).get_future().then(lambda future: future.value()[0])


def _ring_group(state: Any) -> col.Group:
    """The runtime's group under process group ``state`` (None: torch's default group)."""
    pg = dist.group.WORLD if state is None else state
    if not isinstance(pg, RingProcessGroup):
        raise col.CollectiveUsageError(f"reproducible_hook: state: expected None or a process group of the ring "
                                       f"backend (init_process_group('ring')), got {type(pg).__name__}")
    return pg.group
