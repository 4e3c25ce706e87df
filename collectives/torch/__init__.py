"""torch.distributed on the runtime: ``import collectives.torch`` registers the backend "ring".

Under ``mpiexec`` a DDP script needs one word changed::

    import collectives.torch                      # registers "ring"
    dist.init_process_group("ring")               # rank and size from MPI: no MASTER_ADDR/PORT
    model = DistributedDataParallel(model)        # its buckets are all-reduced by the runtime

The process group (``process_group.py``) is an adapter on the public API (``collectives``): it turns
tensors into arrays that share their memory (``tensors.py``) and torch's options into the
runtime's arguments. Its ``Work`` (``work.py``) carries every error the runtime raises to every
door torch has (a synchronous call, ``wait()``, the future DDP's reducer waits on), so a rank
that refuses a call, leaves, dies or is late ends every rank's call with the runtime's message,
within the runtime's timeout (``COLLECTIVES_TIMEOUT``, or torch's ``timeout=`` if shorter).

The rendezvous (``rendezvous.py``): ``init_process_group("ring")`` needs no MASTER_ADDR; rank and
size come from the runtime (MPI) and no socket opens. Importing this module starts nothing.

DDP's communication hook ``reproducible_hook`` (``hooks.py``) averages each bucket with the
reproducible all-reduce: ``model.register_comm_hook(None, collectives.torch.reproducible_hook)``.
"""
from __future__ import annotations

import torch.distributed as dist

import collectives as col
from collectives.process.rendezvous import use_store
from collectives.torch.process_group import BACKEND, RingProcessGroup
from collectives.torch.hooks import reproducible_hook
from collectives.torch.rendezvous import install as install_rendezvous
from collectives.torch.tensors import as_array
from collectives.torch.work import RingBackendError, RingMembershipChanged, RingUsageError, RingWork, for_torch

__all__ = ["BACKEND", "RingProcessGroup", "RingWork", "RingUsageError", "RingBackendError", "RingMembershipChanged",
           "as_array", "reproducible_hook"]


def _create(options, backend_options=None) -> RingProcessGroup:
    """torch's creator for "ring": the world for the default group, a group of its members for
    ``new_group`` (torch calls this on the members alone). Under torchrun the world forms through
    torch's own store (``collectives.process.rendezvous``)."""
    if not options.global_ranks_in_group:
        use_store(options.store, options.group_rank, options.group_size)
    col.init()
    timeout = options.timeout.total_seconds()
    timeout = None if timeout >= col.settings().timeout else timeout   # (None: the runtime's own, checked once)
    ranks = list(options.global_ranks_in_group)
    if not ranks:
        if (options.group_rank, options.group_size) != (col.rank(), col.size()):
            raise col.CollectiveError(f"init_process_group: torch's rank {options.group_rank} of "
                                      f"{options.group_size} is not MPI's, {col.rank()} of {col.size()}; with the "
                                      "ring backend let the launcher set them (leave rank and world_size out: "
                                      "mpiexec, srun, or torchrun's RANK and WORLD_SIZE)")
        return RingProcessGroup(None, timeout)
    try:
        return RingProcessGroup(col.new_group(ranks, members_only=True, timeout=timeout), timeout)
    except (col.CollectiveUsageError, col.CollectiveError) as error:   # (as torch's types, as every call's)
        raise for_torch(error) from error


install_rendezvous()
dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
