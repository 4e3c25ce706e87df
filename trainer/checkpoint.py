"""Checkpoints: plain ``np.savez`` files (no pickle), written atomically, checked by a digest on load;
one run at a time per directory (a lock)."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np

PATTERN = "checkpoint-epoch*.npz"
LOCK = ".lock"
_held: list = []   # the lock files this process holds: open for as long as it runs


class InUse(Exception):
    """Another process holds the directory's lock."""


def lock(directory: Path) -> None:
    """Make ``directory`` (if need be) and take its lock for the rest of this process, or raise
    InUse naming the process that holds it. The lock is the kernel's (flock): it ends with the
    process that holds it, however that process ends, so a crashed run never leaves it behind; and
    the half-written checkpoint of a writer that died mid-save is removed once the lock is taken."""
    directory.mkdir(parents=True, exist_ok=True)
    handle = open(directory / LOCK, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise InUse(f"{directory}: in use by another training run ({holder}); give each run its own "
                    "directory") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    _held.append(handle)
    for unfinished in directory.glob(".checkpoint-*.tmp"):   # a writer that died mid-save (it held the lock)
        unfinished.unlink(missing_ok=True)


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        h.update(name.encode())
        h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


def save(directory: Path, epochs_done: int, step: int, arrays: dict[str, np.ndarray], config: dict,
         keep: int, partial: bool = False) -> Path:
    """Write ``checkpoint-epochNNNNNN.npz`` (NNNNNN: the epochs done, as the log counts them, from 1)
    via a temporary file and a rename. ``partial``: global ``step`` lies inside the next epoch (a
    preemption, ``--max-steps``): ``checkpoint-epochNNNNNN_stepSSSSSSSSS.npz``, which sorts between
    the epochs around it. Once it is written, ``keep`` bounds the directory (``_superseded``): the
    newest ``keep`` epoch checkpoints stay, and a step checkpoint only while it is the newest.

    A crash at any moment leaves either the previous complete file or the new one, never half a file.
    There is no RNG state to store beyond ``config["seed"]``: each epoch's shuffle is drawn
    from a generator seeded with (seed, epoch), so the epoch number recreates it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    payload = {**arrays, "epochs_done": np.int64(epochs_done), "step": np.int64(step),
               "config": np.str_(json.dumps(config, sort_keys=True))}
    payload["digest"] = np.str_(_digest({k: np.asarray(v) for k, v in payload.items()}))
    final = directory / (f"checkpoint-epoch{epochs_done:06d}_step{step:09d}.npz" if partial
                         else f"checkpoint-epoch{epochs_done:06d}.npz")
    descriptor, temporary = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=directory)
    try:
        with open(descriptor, "wb") as f:
            np.savez(f, **payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, final)
    except BaseException:   # a full disk, say: leave nothing half-written behind
        Path(temporary).unlink(missing_ok=True)
        raise
    _sync(directory)   # (the rename on disk before any older checkpoint goes: a crash keeps one of them)
    for old in _superseded(directory, final, keep):
        old.unlink()
    return final


def _sync(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


_NAME = re.compile(r"checkpoint-epoch\d{6}(_step\d{9})?\.npz")


def _superseded(directory: Path, newest: Path, keep: int) -> list[Path]:
    """What ``--keep`` removes once ``newest`` is written: of this run's checkpoints, every epoch
    checkpoint but the newest ``keep``, and every step checkpoint but ``newest`` itself (a step
    checkpoint is a stop's, which the next checkpoint of either kind supersedes).

    This run's are the archives named for no later a point of the training than ``newest``: names
    sort as training goes (``checkpoint-epoch000002.npz``, then ``..._step000000050.npz`` inside
    epoch 3, then ``checkpoint-epoch000003.npz``). A file named for a later point (skipped when this
    run resumed) or one that is no archive at all (a note saved under that name) is neither counted
    nor removed.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> for name in ("000001", "000001_step000000030", "000002", "000002_step000000050", "000009"):
    ...     _ = (d / f"checkpoint-epoch{name}.npz").write_bytes(_ZIP_MAGIC)
    >>> _ = (d / "checkpoint-epoch000003.npz").write_text("notes")
    >>> [p.name for p in _superseded(d, d / "checkpoint-epoch000002_step000000050.npz", 1)]
    ['checkpoint-epoch000001_step000000030.npz', 'checkpoint-epoch000001.npz']
    """
    def ours(path: Path) -> bool:
        try:
            with open(path, "rb") as f:
                return bool(_NAME.fullmatch(path.name)) and path.name <= newest.name and f.read(4) == _ZIP_MAGIC
        except OSError:
            return False
    counted = [path for path in sorted(directory.glob(PATTERN)) if ours(path)]
    epochs = [path for path in counted if "_step" not in path.name]
    return [path for path in counted if "_step" in path.name and path != newest] + epochs[:-keep]


_ZIP_MAGIC = b"PK\x03\x04"


def load(path: Path) -> dict[str, np.ndarray]:
    """Read and verify one checkpoint; raises ValueError saying what is wrong with it.

    >>> import tempfile; text = Path(tempfile.mkdtemp()) / "checkpoint-epoch000001.npz"
    >>> _ = text.write_text("notes")
    >>> load(text)
    Traceback (most recent call last):
    ...
    ValueError: checkpoint-epoch000001.npz: not a checkpoint: a checkpoint is an .npz (zip) archive, and this file begins with b'notes'
    """
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise ValueError(f"{path.name}: unreadable ({e.strerror or e})") from e
    if not head.startswith(_ZIP_MAGIC):   # (numpy takes any other file for a pickle, and says so)
        raise ValueError(f"{path.name}: not a checkpoint: a checkpoint is an .npz (zip) archive, and this file "
                         f"{'is empty' if not head else f'begins with {head!r}'}")
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {name: f[name] for name in f.files}
    except Exception as e:   # truncated zip, bad header, not an npz at all
        raise ValueError(f"{path.name}: unreadable ({type(e).__name__}: {e})") from e
    stored = str(arrays.pop("digest", ""))
    if not stored or stored != _digest(arrays):
        raise ValueError(f"{path.name}: digest mismatch (corrupted or incomplete)")
    return arrays


def epochs_done(saved: dict[str, np.ndarray]) -> int:
    """How many epochs a loaded checkpoint covers (files before the 1-based numbering stored the
    0-based index of the last epoch as "epoch")."""
    return int(saved["epochs_done"]) if "epochs_done" in saved else int(saved["epoch"]) + 1


def newest_valid(directory: Path, report=print) -> tuple[Path, dict[str, np.ndarray]] | None:
    """The newest checkpoint that loads and verifies; each bad one is reported and skipped."""
    for path in sorted(directory.glob(PATTERN), reverse=True):
        try:
            return path, load(path)
        except ValueError as e:
            report(f"skipping checkpoint {e}")
    return None
