"""The state of an elastic job (``col.elastic.State``): what a change of the world rolls back to,
kept on every rank by ``commit()`` and handed to the ranks of a new world by ``sync()``. Part of
``collectives.elastic``, which re-exports it; ``collectives.elastic.run`` drives it."""
from __future__ import annotations

import copy
import json
import sys
from typing import Any, Callable

import numpy as np

from collectives.api import broadcast
from collectives.process.changes import Change
from collectives.errors import CollectiveUsageError
from collectives.process.startup import rank
from ring import arrays


class State:
    """Arrays (numpy or cupy arrays, torch CPU tensors; updated in place or replaced) and plain values (numbers, strings, lists and
    dicts of them: what JSON holds) that roll back together. ``commit()`` keeps a copy on this
    rank (no disk, no communication); ``restore()`` puts the last one back, arrays in place (so
    views of them held elsewhere stay valid); ``sync()`` gives every rank rank 0's.

    >>> state = State(weights=np.zeros(3), step=0)
    >>> state.weights += 1; state.step = 1; state.commit()
    >>> state.weights += 1; state.step = 2
    >>> state.restore(); state.weights, state.step, state.commits
    (array([1., 1., 1.]), 1, 1)
    """

    def __init__(self, **items: Any):
        names = {}
        for name, value in items.items():
            if name.startswith("_") or name == "commits" or hasattr(State, name):
                raise CollectiveUsageError(f"elastic.State: {name}: a name State keeps for itself (its methods, "
                                           "commits, and names that begin with _); choose another")
            names[name] = _check(name, value)
        object.__setattr__(self, "_items", names)
        object.__setattr__(self, "commits", 0)
        object.__setattr__(self, "_kept", None)
        object.__setattr__(self, "_callbacks", [])
        object.__setattr__(self, "_at_commit", None)   # run's growth check, with host discovery
        self._keep()
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
        """Keep a copy of every item on this rank: what a change of the world rolls back to. Under
        ``run(..., host_discovery=...)`` also a collective call, the moment newcomers may join: every
        rank must commit together (rank 0 tells the others whether the job grows now)."""
        self._keep()
        if self._at_commit is not None:
            self._at_commit()

    def _keep(self) -> None:
        before = self._kept or {}
        kept = {name: _copy_into(before.get(name), value) for name, value in self._items.items()}
        object.__setattr__(self, "_kept", kept)
        object.__setattr__(self, "commits", self.commits + 1)

    def restore(self) -> None:
        """Put the last commit back: arrays (and tensors) of the same shape and dtype in place, the rest by value."""
        for name, saved in self._kept.items():
            current, kept = _array(self._items.get(name)), _array(saved)
            if current is not None and kept is not None and type(self._items[name]) is type(saved) \
                    and current.shape == kept.shape and current.dtype == kept.dtype \
                    and getattr(current.flags, "writeable", True):   # (cupy arrays have no such flag)
                arrays.copy_(current, kept)
            else:
                self._items[name] = _copy_into(None, saved)

    def sync(self, root: int = 0) -> None:
        """Every rank: take rank ``root``'s items (arrays broadcast in place, values as JSON), and
        commit them. Every rank must hold the same item names; an array whose shape or dtype
        differs from rank ``root``'s (one replaced since the start, on a newcomer that holds the
        start's) is replaced by one of rank ``root``'s first."""
        values = {name: v for name, v in self._items.items() if _array(v) is None}
        arrays = {name: [list(_array(v).shape), _dtype_name(_array(v).dtype)] for name, v in self._items.items()
                  if _array(v) is not None}
        received = broadcast_json({"values": values, "arrays": arrays, "commits": self.commits}, root,
                                   "elastic state")
        if set(received["values"]) | set(received["arrays"]) != set(self._items):
            raise CollectiveUsageError(f"elastic.State.sync: rank {root} holds items {sorted(received['values'])}"
                                       f" + {sorted(received['arrays'])}, this rank {sorted(self._items)}: every "
                                       "rank must make the same State")
        for name, (shape, dtype) in received["arrays"].items():
            array = _array(self._items[name])
            if array is None:   # a plain value here, an array on rank root: a numpy array of root's
                self._items[name] = np.empty(tuple(shape), np.dtype(dtype))
            elif array.shape != tuple(shape) or array.dtype != np.dtype(dtype):
                self._items[name] = _empty_like_kind(self._items[name], tuple(shape), np.dtype(dtype))
            broadcast(_array(self._items[name]), root=root, name=f"elastic state {name}")
        self._items.update(received["values"])
        self._keep()
        object.__setattr__(self, "commits", received["commits"])

    def on_change(self, callback: Callable[["State", Change], None]) -> None:
        """Call ``callback(state, change)`` on every rank after each change of the world, once the
        state is rolled back and synced (to rebuild what depends on the world: groups, shards);
        a newcomer calls it too, on entering ``run``, with the change that it joined by."""
        self._callbacks.append(callback)

    def changed(self, change: Change) -> None:
        """Call the ``on_change`` callbacks with ``change`` (``run`` does, once a change is settled)."""
        for callback in self._callbacks:
            callback(self, change)

    def at_commit(self, hook: Callable[[], None] | None) -> None:
        """Call ``hook()`` after each ``commit`` (None: nothing): ``run`` asks there whether newcomers
        join, under host discovery."""
        object.__setattr__(self, "_at_commit", hook)

    def where(self) -> str:
        """Where the state stands, as the line of a change says: its ``step`` if it has one, else
        how many commits it holds."""
        return f"step {self._items['step']}" if "step" in self._items else f"commit {self.commits}"


def broadcast_json(value: Any, root: int, name: str) -> Any:
    """Rank ``root``'s ``value`` (JSON), on every rank: its length, then its text."""
    text = json.dumps(value).encode() if rank() == root else b""
    length = broadcast(np.array([len(text)], np.int64), root=root, name=name)
    encoded = np.frombuffer(text, np.uint8).copy() if rank() == root else np.empty(int(length[0]), np.uint8)
    return json.loads(broadcast(encoded, root=root).tobytes())


def _array(value: Any) -> Any:
    """The array that holds an item's data: a numpy or cupy array itself, a torch tensor's memory
    (``.numpy()``, shared; a dtype numpy lacks, like bfloat16, as integers of its size: its bytes),
    None for a plain value. torch is never imported here: a program that holds a tensor has imported it."""
    if arrays.is_array(value):
        return value
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return None
    tensor = value.detach()
    try:
        return tensor.numpy()
    except TypeError:
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]
        return tensor.view(bits).numpy()


def _dtype_name(dtype: np.dtype) -> str:
    """``dtype`` as text that ``np.dtype`` reads back: its name for a user dtype such as ml_dtypes'
    bfloat16 (whose ``str``, '<V2', reads back as raw bytes), else its ``str`` (which keeps the byte order).

    >>> _dtype_name(np.dtype(">f4"))
    '>f4'
    """
    return dtype.name if dtype.isbuiltin == 2 else dtype.str


def _empty_like_kind(item: Any, shape: tuple, dtype: np.dtype) -> Any:
    """A new array of ``shape`` and ``dtype`` of ``item``'s kind: numpy, cupy (on the current GPU), or
    a torch tensor (of ``item``'s dtype where ``dtype`` stands for its bytes: see ``_array``)."""
    if arrays.is_array(item):
        return arrays.xp_of(item).empty(shape, dtype)
    tensor = sys.modules["torch"].from_numpy(np.empty(shape, dtype))
    return tensor.view(item.dtype) if tensor.element_size() == item.element_size() else tensor


def _copy_into(kept: Any, value: Any) -> Any:
    """A copy of ``value`` of its own type, into ``kept`` where it fits (a commit every step then
    costs a memcpy, not a fresh allocation whose pages fault in: 0.4 ms instead of 2.4 ms for
    2 x 1.3 M floats)."""
    source = _array(value)
    if source is None:
        return copy.deepcopy(value)
    target = _array(kept)
    if target is not None and type(kept) is type(value) and target.shape == source.shape \
            and target.dtype == source.dtype:
        arrays.copy_(target, source)
        return kept
    return value.copy() if arrays.is_array(value) else value.detach().clone()


def _check(name: str, value: Any) -> Any:
    """``value`` if a State can hold it: an array of numbers (a numpy array, a torch tensor) or a
    value that JSON gives back as it was (what ``sync`` sends); else CollectiveUsageError naming it."""
    problem = _tensor_problem(value)
    if problem:
        raise CollectiveUsageError(f"elastic.State: {name}: {problem}")
    array = _array(value)
    if array is not None:
        if array.dtype.hasobject:
            raise CollectiveUsageError(f"elastic.State: {name}: an array of Python objects (dtype object) cannot be "
                                       "sent to other ranks; hold numbers, or a list of plain values")
        return value
    problem = _not_plain(value)
    if problem:
        raise CollectiveUsageError(f"elastic.State: {name}: expected a numpy or cupy array or a plain value (None, bools, "
                                   f"numbers, strings, and lists and str-keyed dicts of them), got {problem}")
    return value


def _tensor_problem(value: Any) -> str:
    """Why a State cannot hold torch tensor ``value`` as the memory it copies in place ("": it can)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return ""
    if value.device.type != "cpu":
        return f"a tensor on {value.device} (State holds CPU tensors; hold a GPU's arrays as cupy arrays, or a CPU copy)"
    if value.layout != torch.strided or value.is_quantized:
        kind = "quantized" if value.is_quantized else str(value.layout)
        return f"a {kind} tensor (State holds dense tensors: hold .to_dense() or .dequantize())"
    if value.is_conj() or value.is_neg():
        return "a tensor with its conjugate or negative bit set (hold .resolve_conj() or .resolve_neg())"
    return ""


def _not_plain(value: Any) -> str:
    """What in ``value`` JSON would not give back as it is ("" if nothing): a tuple comes back a
    list, a dict's int key a string, a numpy integer not at all (numpy's float64, a float, comes
    back as the same number)."""
    if value is None or isinstance(value, (int, float, str)):
        return ""
    if type(value) is list:
        return next((problem for problem in map(_not_plain, value) if problem), "")
    if type(value) is dict:
        keys = [key for key in value if type(key) is not str]
        if keys:
            return f"a dict with a key that is not a string ({keys[0]!r}: it would come back as {str(keys[0])!r})"
        return next((problem for problem in map(_not_plain, value.values()) if problem), "")
    hint = " (it would come back as a list: use a list)" if isinstance(value, tuple) else ""
    return f"{type(value).__name__} {value!r:.60}{hint}"
