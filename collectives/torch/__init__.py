"""torch.distributed on the runtime: ``import collectives.torch`` registers the backend "ring".

Under ``mpiexec`` a DDP script needs one word changed::

    import collectives.torch                      # registers "ring"
    dist.init_process_group("ring")               # rank and size from MPI: no MASTER_ADDR/PORT
    model = DistributedDataParallel(model)        # its buckets are all-reduced by the runtime

The process group (``group.py``) is an adapter on the public API (``collectives``): it turns
tensors into arrays that share their memory (``tensors.py``) and torch's options into the
runtime's arguments. Its ``Work`` (``work.py``) carries every error the runtime raises to every
door torch has (a synchronous call, ``wait()``, the future DDP's reducer waits on), so a rank
that refuses a call, leaves, dies or is late ends every rank's call with the runtime's message,
within the runtime's timeout (``COLLECTIVES_TIMEOUT``, or torch's ``timeout=`` if shorter).

The rendezvous: for ``init_process_group("ring")`` without MASTER_ADDR, ``env://`` (torch's
default) takes rank and size from the runtime (MPI) and opens no socket; its store refuses every
use by name, since nothing here needs one. Every other use of ``env://`` (gloo, nccl, or ring with
MASTER_ADDR and MASTER_PORT) is torch's own, untouched; importing this module starts nothing.
"""
from __future__ import annotations

import importlib
import inspect
import os
import sys

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import collectives as col
from collectives.torch.group import BACKEND, RingProcessGroup
from collectives.torch.tensors import as_array
from collectives.torch.work import RingBackendError, RingMembershipChanged, RingUsageError, RingWork, for_torch

__all__ = ["BACKEND", "RingProcessGroup", "RingWork", "RingUsageError", "RingBackendError", "RingMembershipChanged",
           "as_array"]


def _create(options, backend_options=None) -> RingProcessGroup:
    """torch's creator for "ring": the world for the default group, a group of its members for
    ``new_group`` (torch calls this on the members alone)."""
    col.init()
    timeout = options.timeout.total_seconds()
    timeout = None if timeout >= col.settings().timeout else timeout   # (None: the runtime's own, checked once)
    ranks = list(options.global_ranks_in_group)
    if not ranks:
        if (options.group_rank, options.group_size) != (col.rank(), col.size()):
            raise col.CollectiveError(f"init_process_group: torch's rank {options.group_rank} of "
                                      f"{options.group_size} is not MPI's, {col.rank()} of {col.size()}; with the "
                                      "ring backend let MPI set them (leave rank and world_size out; the world "
                                      "comes from mpiexec, not torchrun or mp.spawn)")
        return RingProcessGroup(None, timeout)
    try:
        return RingProcessGroup(col.new_group(ranks, members_only=True, timeout=timeout), timeout)
    except (col.CollectiveUsageError, col.CollectiveError) as error:   # (as torch's types, as every call's)
        raise for_torch(error) from error


class RefusingStore(dist.Store):
    """The store of the "ring" rendezvous: nothing in the runtime needs one, so every use is
    refused by name rather than left waiting for keys that no other rank can see."""

    def _refuse(self, *args, **kwargs):
        raise RuntimeError("the ring backend's rendezvous keeps no key-value store (it opens no socket); a backend "
                           "or tool that needs one (gloo, TORCH_DIST_INIT_BARRIER=1) needs MASTER_ADDR and "
                           "MASTER_PORT set, as with torch's own env:// rendezvous")

    set = get = add = compare_set = wait = check = delete_key = num_keys = multi_get = multi_set = _refuse
    getNumKeys = deleteKey = _refuse   # (the names some of torch's C++ asks for)


_STORE = RefusingStore()   # (kept here: torch's C++ holds it without keeping the Python object alive)
_rendezvous = importlib.import_module("torch.distributed.rendezvous")   # (the package names a function so too)
_torch_env_handler = _rendezvous._rendezvous_handlers["env"]
_INIT_PROCESS_GROUP = inspect.unwrap(c10d.init_process_group).__code__   # (under torch's logging decorators)


def _asked_for_ring() -> bool:
    """Whether the rendezvous under way is ``init_process_group``'s for the ring backend alone
    ("ring", or "cpu:ring,cuda:ring"). torch runs the ``env://`` handler from ``init_process_group``
    before it creates the backend, and passes the handler nothing of it: that call's own
    ``backend`` is the one place that says which backend the rendezvous is for."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not _INIT_PROCESS_GROUP:
        frame = frame.f_back
    named = str(frame.f_locals.get("backend") or "") if frame is not None else ""
    return {part.rpartition(":")[2] for part in named.lower().split(",")} == {BACKEND}


def _env_or_runtime(url: str, **kwargs):
    """``env://``: for ``init_process_group("ring")`` without MASTER_ADDR, rank and size from the
    runtime (MPI); for everything else torch's own handler, as if this one were not there."""
    if os.environ.get("MASTER_ADDR") or not _asked_for_ring():
        yield from _torch_env_handler(url, **kwargs)
        return
    col.init()
    yield _STORE, col.rank(), col.size()
    raise RuntimeError("the ring rendezvous cannot rendezvous again: restart the job")


# torch looks its handlers up by the URL's scheme alone, and the ring backend's users keep torch's default URL
# (env://), so the ring rendezvous stands in front of torch's env:// handler, handing it every other rendezvous.
_rendezvous._rendezvous_handlers["env"] = _env_or_runtime   # (register_rendezvous_handler refuses a second "env")
dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
