"""The ring backend's rendezvous: rank and size from the runtime (MPI), no socket, no store.

torch's ``init_process_group`` finds its ranks through a rendezvous named by a URL's scheme
before it creates any backend. The ring backend needs none (MPI already knows the world), so it
offers two doors, both registered by ``install()`` when ``collectives.torch`` is imported:

========================================  ====================================================
``init_process_group("ring",              the scheme of its own, ``ring://``, registered with
init_method="ring://")``                  torch's public ``register_rendezvous_handler``
``init_process_group("ring")`` (torch's   ``env://`` as torch reads it where MASTER_ADDR is
default ``env://``)                       set; where it is not, torch's own would fail, and
                                          the ring rendezvous answers instead
========================================  ====================================================

torch tells a rendezvous nothing of the backend it is for, so the second door decides by the
environment alone: without MASTER_ADDR, ``env://`` is the ring rendezvous for every backend, and
a backend that needs a store (gloo, nccl) is told by name to set MASTER_ADDR and MASTER_PORT.

torch's public API has no way to stand in front of a scheme it has (``register_rendezvous_handler``
refuses a second ``env``, and ``init_process_group`` asks ``env://`` before any backend is made),
so the second door replaces the entry in torch's table of handlers, keeping torch's own handler for
every rendezvous with MASTER_ADDR. The runtime does not need that table: where a torch has none,
the second door is not opened, and ``ring://`` (public) and torch's own ``env://`` (which then
needs MASTER_ADDR) still serve.
"""
from __future__ import annotations

import importlib
import os
from typing import Iterator

import torch.distributed as dist

import collectives as col

SCHEME = "ring"


class RefusingStore(dist.Store):
    """The store of the ring rendezvous: nothing in the runtime needs one, so every use is
    refused by name rather than left waiting for keys that no other rank can see."""

    def _refuse(self, *args, **kwargs):
        raise RuntimeError("the ring rendezvous (ring://, or env:// without MASTER_ADDR once collectives.torch is "
                           "imported) keeps no key-value store and opens no socket; a backend or tool that needs one "
                           "(gloo, nccl, TORCH_DIST_INIT_BARRIER=1) needs MASTER_ADDR and MASTER_PORT set, as with "
                           "torch's own env:// rendezvous")

    set = get = add = compare_set = wait = check = delete_key = num_keys = multi_get = multi_set = _refuse
    getNumKeys = deleteKey = _refuse   # (the names some of torch's C++ asks for)


_STORE = RefusingStore()   # (kept here: torch's C++ holds it without keeping the Python object alive)


def ring_rendezvous(url: str, **kwargs) -> Iterator[tuple[dist.Store, int, int]]:
    """torch's rendezvous for the ring backend: (a refusing store, MPI's rank, MPI's size), once.

    >>> next(ring_rendezvous("ring://"))[1:] == (col.rank(), col.size())   # doctest: +SKIP
    True
    """
    col.init()
    yield _STORE, col.rank(), col.size()
    raise RuntimeError("the ring rendezvous cannot rendezvous again: restart the job")


def install() -> None:
    """Register ``ring://`` and put the ring rendezvous in front of torch's ``env://`` handler
    for the case torch's own cannot serve (no MASTER_ADDR), where torch keeps a table of
    handlers. Idempotent."""
    try:
        dist.register_rendezvous_handler(SCHEME, ring_rendezvous)
    except RuntimeError:   # (registered already: torch refuses a scheme twice)
        pass
    handlers = importlib.import_module("torch.distributed.rendezvous")   # (the package names a function so too)
    table = getattr(handlers, "_rendezvous_handlers", {})   # (torch's own: see the module's docstring)
    torch_env = table.get("env")
    if torch_env is None or getattr(torch_env, "stands_in_for", None) is not None:
        return

    def env_or_ring(url: str, **kwargs):
        if os.environ.get("MASTER_ADDR"):
            return torch_env(url, **kwargs)
        return ring_rendezvous(url, **kwargs)

    env_or_ring.stands_in_for = torch_env
    table["env"] = env_or_ring   # (register_rendezvous_handler refuses a second "env")
