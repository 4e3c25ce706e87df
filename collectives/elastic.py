"""Elastic training: when a rank dies or its host vanishes, the survivors go on in-process, in a
world of their own, from the last commit; newcomers found by a host discovery script join at a
commit. No process restarts and no driver: the survivors agree on who is gone and make their
communicator with MPI itself (``collectives.world.rebuild``).

    state = col.elastic.State(params=params, velocity=velocity, step=0)

    def train(state):
        while state.step < steps:
            grads = gradients(state.params, shard(state.step, col.rank(), col.size()))
            col.allreduce(grads, op="avg", out=grads)
            update(state.params, state.velocity, grads)
            state.step += 1
            state.commit()            # what a change rolls back to: kept in memory on every rank

    col.elastic.run(train, state, min_ranks=2)

Launch with ``mpiexec -disable-auto-cleanup`` (else MPICH's launcher kills every rank when one
dies). A change rolls every rank back to the last commit that rank 0 of the new world holds
(``State.sync``), so a step during which a rank died is done again by the survivors: the
result is the one a restart from that commit would give, bit for bit. An exception in the
program (not a death) still ends the job; so does a world smaller than ``min_ranks``.
See docs/elastic.md.
"""
from __future__ import annotations

import copy
import json
import os
import signal
import sys
import time
from typing import Any, Callable

import numpy as np

from collectives import world as worlds
from collectives.api import broadcast
from collectives.changes import Change
from collectives.errors import CollectiveError, CollectiveUsageError, MembershipChanged
from collectives.world import rank, size

__all__ = ["State", "run", "supervise", "Change", "MembershipChanged"]

class State:
    """Arrays (numpy, or torch CPU tensors such as a model's parameters; updated in place or
    replaced) and plain values (numbers, strings, lists and dicts of them: what JSON holds) that
    roll back together. ``commit()`` keeps a copy on this rank (no disk, no communication);
    ``restore()`` puts the last one back, arrays in place (so views of them held elsewhere, and
    a model's parameters, stay valid); ``sync()`` gives every rank rank 0's.

    >>> state = State(weights=np.zeros(3), step=0)
    >>> state.weights += 1; state.step = 1; state.commit()
    >>> state.weights += 1; state.step = 2
    >>> state.restore(); state.weights, state.step, state.commits
    (array([1., 1., 1.]), 1, 1)
    """

    def __init__(self, **items: Any):
        names = {}
        for name, value in items.items():
            names[name] = _check(name, value)
        object.__setattr__(self, "_items", names)
        object.__setattr__(self, "commits", 0)
        object.__setattr__(self, "_kept", None)
        object.__setattr__(self, "_callbacks", [])
        self.commit()
        object.__setattr__(self, "commits", 0)

    def __getattr__(self, name: str) -> Any:
        items = object.__getattribute__(self, "_items")
        if name in items:
            return items[name]
        raise AttributeError(f"State has no {name!r} (it holds {', '.join(items) or 'nothing'})")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._items:
            raise AttributeError(f"State: {name!r} is not one of its items ({', '.join(self._items)}); give every "
                                 "item to State(...) at the start")
        self._items[name] = _check(name, value)

    def commit(self) -> None:
        """Keep a copy of every item on this rank: what a change of the world rolls back to."""
        kept = {name: _copy(value) for name, value in self._items.items()}
        object.__setattr__(self, "_kept", kept)
        object.__setattr__(self, "commits", self.commits + 1)

    def restore(self) -> None:
        """Put the last commit back: arrays of the same shape and dtype in place, the rest by value."""
        for name, saved in self._kept.items():
            current, kept = _array(self._items.get(name)), _array(saved)
            if kept is not None and current is not None and current.shape == kept.shape \
                    and current.dtype == kept.dtype:
                np.copyto(current, kept)
            else:
                self._items[name] = _copy(saved)

    def sync(self, root: int = 0) -> None:
        """Every rank: take rank ``root``'s items (arrays broadcast in place, values as JSON), and
        commit them. Every rank must hold the same item names, arrays of the same shapes."""
        values = {name: v for name, v in self._items.items() if _array(v) is None}
        text = json.dumps({"values": values, "commits": self.commits}).encode() if rank() == root else b""
        length = broadcast(np.array([len(text)], np.int64), root=root, name="elastic state")
        encoded = np.frombuffer(text, np.uint8).copy() if rank() == root else np.empty(int(length[0]), np.uint8)
        received = json.loads(broadcast(encoded, root=root).tobytes())
        for value in self._items.values():
            if _array(value) is not None:
                broadcast(_array(value), root=root)
        self._items.update(received["values"])
        self.commit()
        object.__setattr__(self, "commits", received["commits"])

    def on_change(self, callback: Callable[["State", Change], None]) -> None:
        """Call ``callback(state, change)`` on every rank after each change of the world, once the
        state is rolled back and synced (to rebuild what depends on the world: groups, shards)."""
        self._callbacks.append(callback)

    def where(self) -> str:
        """Where the state stands, as the line of a change says: its ``step`` if it has one, else
        how many commits it holds."""
        return f"step {self._items['step']}" if "step" in self._items else f"commit {self.commits}"


def run(fn: Callable[[State], Any], state: State, *, min_ranks: int = 1, max_ranks: int | None = None,
        announce: bool = True) -> Any:
    """Run ``fn(state)`` until it returns, through every change of the world: when a rank dies (or
    its host vanishes), the survivors make a world of their own (``collectives.world.rebuild``),
    roll back to the last commit that the new rank 0 holds, and call ``fn`` again; a newcomer
    (spawned into the job) takes the state from rank 0 first. Rank 0 prints one line per change.

    Raises what ``fn`` raises otherwise (an exception of the program ends the job, as without
    elastic), and CollectiveError when fewer than ``min_ranks`` remain.

    >>> result = col.elastic.run(train, state, min_ranks=2)         # doctest: +SKIP
    """
    if not isinstance(min_ranks, int) or isinstance(min_ranks, bool) or min_ranks < 1:
        raise CollectiveUsageError(f"elastic.run: min_ranks: expected an int >= 1, got {min_ranks!r}")
    if max_ranks is not None and (not isinstance(max_ranks, int) or max_ranks < min_ranks):
        raise CollectiveUsageError(f"elastic.run: max_ranks: expected None or an int >= min_ranks "
                                   f"({min_ranks}), got {max_ranks!r}")
    _check_size(min_ranks, "at the start")
    state.sync()
    while True:
        try:
            return fn(state)
        except Exception as error:   # (not only CollectiveError: one that crossed torch's C++, as DDP's
            began = time.monotonic()   # backward raises it, arrives as a RuntimeError; the world decides)
            if not _a_rank_is_gone():
                raise
            change = _recover(error)
        _check_size(min_ranks, f"after {change.text}")
        state.restore()
        state.sync()
        if announce and rank() == 0:
            print(f"elastic: {change.text}; back to {state.where()} (the world rebuilt in "
                  f"{time.monotonic() - began:.2f} s)", flush=True)
        for callback in state._callbacks:
            callback(state, change)


def _a_rank_is_gone() -> bool:
    """Whether the world stopped because a rank died or its host vanished (a change of
    membership), rather than because of the program (a rank that raised, a usage error)."""
    world = worlds.the_world
    if world is None or world.runtime.failure is None:
        return False
    return bool(world.transport.control.known_dead())


def _recover(error: Exception) -> Change:
    try:
        return worlds.rebuild()
    except CollectiveError as e:
        raise CollectiveError(f"elastic: the survivors could not make a new world after {error}: {e}") from e


def _check_size(min_ranks: int, when: str) -> None:
    if size() < min_ranks:
        raise CollectiveError(f"elastic: {size()} rank(s) left {when}, fewer than min_ranks={min_ranks}; the job ends")


def _array(value: Any) -> np.ndarray | None:
    """The numpy array that holds an item's data: a numpy array itself, a torch tensor's memory
    (``.numpy()``, shared), None for a plain value. torch is never imported here: a program that
    holds a tensor has imported it."""
    if isinstance(value, np.ndarray):
        return value
    torch = sys.modules.get("torch")
    return value.detach().numpy() if torch is not None and isinstance(value, torch.Tensor) else None


def _copy(value: Any) -> Any:
    """A copy of an item, of its own type (a tensor's copy is a tensor, without autograd's history)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    return value.detach().clone() if _array(value) is not None else copy.deepcopy(value)


def _check(name: str, value: Any) -> Any:
    try:
        if _array(value) is not None:
            return value
    except (TypeError, RuntimeError) as e:   # (a GPU tensor, a dtype numpy lacks: bfloat16)
        raise CollectiveUsageError(f"elastic.State: {name}: a torch tensor must be on the CPU, of a dtype that "
                                   f"numpy has: {e}") from None
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise CollectiveUsageError(f"elastic.State: {name}: expected a numpy array, a torch CPU tensor or a plain "
                                   f"value (numbers, strings, lists and dicts of them), got {type(value).__name__}: "
                                   f"{e}") from None
    return value


def supervise() -> None:
    """Run the rest of this program in a child process, this one waiting for it and exiting with
    its status (128 + the signal, if a signal ended it). Call it first thing, before MPI starts.

    MPICH's launcher (hydra's proxy) SIGKILLs every rank on a host once one of the processes it
    started is found ended by a signal, even under ``-disable-auto-cleanup``: the survivors of a
    kill would die at the proxy's next event (their next line of output). Under a supervisor the
    proxy sees a plain exit instead. Signals sent to the rank's process group (the launcher's
    Ctrl-C, its failure notices) reach the child directly; the supervisor ignores them. Only
    under MPICH's launcher (PMI_FD or PMI_PORT set, no Open MPI); elsewhere it does nothing.

    >>> col.elastic.supervise()       # the first line of the program          # doctest: +SKIP
    """
    if "OMPI_COMM_WORLD_RANK" in os.environ or not ({"PMI_FD", "PMI_PORT"} & os.environ.keys()) \
            or "mpi4py.MPI" in sys.modules and sys.modules["mpi4py.MPI"].Is_initialized():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        _die_with_parent()
        return
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def _die_with_parent() -> None:
    """The supervised child ends with its supervisor (prctl PR_SET_PDEATHSIG: Linux only)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass

