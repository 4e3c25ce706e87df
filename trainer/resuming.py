"""Resuming: the newest valid checkpoint, read by rank 0 and broadcast, and what a resumed run
must share with it; the metrics file cut back to the epochs the checkpoint covers."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import collectives as col
from cmdline.parser import USAGE
from trainer import checkpoint
from trainer.arguments import RESUME_MUST_MATCH, agree_on
from trainer.model import MLP
from trainer.optim import SGD


def config_of(args, dataset) -> dict:
    """The settings a checkpoint records: the model, and what the training's arithmetic depends on
    (local SGD's and DiLoCo's own only for them: a checkpoint of one strategy may go on with another,
    every checkpoint being a sync point), --compression included: its residuals are of that codec.

    >>> from types import SimpleNamespace as S
    >>> args = S(hidden=[8], dtype="float64", dataset="digits", seed=0, batch_size=64, lr=0.1, momentum=0.9,
    ...          weight_decay=0.0, strategy="diloco", sync_every=4, outer_lr=0.7, outer_momentum=0.9,
    ...          compression="none", inner_state="local")
    >>> sorted(config_of(args, S(train_x=np.zeros((1, 64)), classes=10)))[-4:]
    ['sizes', 'strategy', 'sync_every', 'weight_decay']
    """
    config = {"sizes": [dataset.train_x.shape[1], *args.hidden, dataset.classes], "dtype": args.dtype,
              "dataset": args.dataset, "seed": args.seed, "batch_size": args.batch_size, "lr": args.lr,
              "momentum": args.momentum, "weight_decay": args.weight_decay, "strategy": args.strategy,
              "compression": args.compression}
    if args.strategy in ("local-sgd", "diloco"):
        config.update(sync_every=args.sync_every, inner_state=args.inner_state)
    if args.strategy == "diloco":
        config.update(outer_lr=args.outer_lr, outer_momentum=args.outer_momentum)
    if getattr(args, "reproducible", False):   # (another count of shards sums other contributions)
        config.update(shards=args.shards)
    return config


def changed_settings(saved: dict, config: dict) -> list[str]:
    """The training settings this run changes from the checkpoint's (older checkpoints lack some).

    >>> changed_settings({"dataset": "digits", "seed": 0}, {"dataset": "synthetic", "seed": 0})
    ['--dataset digits -> synthetic']
    """
    return [f"{flag} {saved[key]} -> {config[key]}" for flag, key in RESUME_MUST_MATCH.items()
            if key in saved and key in config and saved[key] != config[key]]


def foreign_residuals(saved: dict, config: dict) -> str:
    """Why the error-feedback residuals of a checkpoint with settings ``saved`` are not this run's
    ("": they are): another --compression (a resume allows it only with --resume-changed) or
    another strategy (the all-reduce's residual is of gradients, DiLoCo's of deltas). A residual is
    the last step's rounding, not yet delivered: dropped, at most that is lost.

    >>> foreign_residuals({"strategy": "allreduce", "compression": "bf16"},
    ...                   {"strategy": "allreduce", "compression": "none"})
    'they are of --compression bf16 and this run has --compression none'
    """
    for flag, key in (("--compression", "compression"), ("--strategy", "strategy")):
        if key in saved and saved[key] != config[key]:
            return f"they are of {flag} {saved[key]} and this run has {flag} {config[key]}"
    return ""


def resume(args, model: MLP, opt: SGD, config: dict, steps_per_epoch: int, like_params: dict | None = None,
           residual=None) -> tuple[int, int]:
    """Load the newest valid checkpoint on rank 0 and broadcast it; returns the epoch to start at
    (0-based) and the global step it was written at (inside that epoch for ``--max-steps`` or a
    preemption). With none yet, (0, 0): one batch script serves the first run and every requeue. A
    checkpoint holds the whole model, whatever --tensor-parallel or number of ranks wrote it:
    each rank takes its part, and the batches are split for this run's ranks. ``like_params``
    (name -> this rank's array, laid out like the parameters: DiLoCo's outer momentum) and
    ``residual`` (this rank's error feedback) are loaded where the checkpoint has them, else zeroed
    (``load_extras``). The inner momentum: see ``inner_momentum``."""
    # [found a usable one, epochs already done, step, each rank takes its own momentum back]
    status, problem, saved = np.zeros(4, np.int64), "", {}
    full_params, full_velocity = (model.xp.empty(model.full_size(), model.flat_params.dtype) for _ in range(2))
    if col.rank() == 0:
        problem, saved = _read_newest(args, model, config, steps_per_epoch, status, full_params, full_velocity)
    agree_on(problem)
    col.broadcast(status, root=0)
    if not status[0]:
        return 0, 0   # (rank 0's initialisation, already on every rank)
    model.load_full(col.broadcast(full_params, root=0))
    model.load_full(col.broadcast(full_velocity, root=0), into=opt.velocity)
    if status[3]:
        rows = _broadcast_array(saved.get("inner_velocities"), opt.velocity.dtype)
        model.load_full(model.xp.asarray(rows.reshape(col.size(), -1)[col.rank()]), into=opt.velocity)
    load_extras(model, saved, like_params or {}, residual)
    return int(status[1]), int(status[2])


def _read_newest(args, model: MLP, config: dict, steps_per_epoch: int, status, full_params, full_velocity):
    """Rank 0: find the newest valid checkpoint and check it fits this run; fill ``status``,
    ``full_params`` and ``full_velocity`` from it and say so. Returns the usage problem ("" if none)
    and the checkpoint's arrays ({} if none)."""
    found = checkpoint.newest_valid(args.checkpoint_dir, report=lambda m: print(m, file=sys.stderr))
    if found is None and not any(args.checkpoint_dir.glob(checkpoint.PATTERN)):
        print(f"--resume: no checkpoint in {args.checkpoint_dir} yet: starting from the beginning", flush=True)
        return "", {}
    if found is None:   # (some, none usable: starting over would throw a run away without a word)
        return f"{USAGE}:--resume: no usable checkpoint in {args.checkpoint_dir}", {}
    path, saved = found
    saved_config = json.loads(str(saved["config"]))
    problem = _misfit(args, model, config, path, saved, saved_config)
    if problem:
        return problem, {}
    why = foreign_residuals(saved_config, config) if "residuals" in saved else ""
    if why:
        saved = {name: a for name, a in saved.items() if name not in ("residuals", "residual_sizes")}
    full_params[...] = model.xp.asarray(saved["params"])   # (``saved`` stays: load_extras reads it)
    full_velocity[...] = model.xp.asarray(saved["velocity"])
    status[3], average, note = inner_momentum(args, saved, path.name, model.full_size())
    if average is not None:
        full_velocity[...] = model.xp.asarray(average)
    done = checkpoint.epochs_done(saved)
    step = int(saved["step"]) if "step" in saved else done * steps_per_epoch
    status[:3] = (1, done, step)
    inside = f", step {step}" if step != done * steps_per_epoch else ""
    print(f"resuming from {path} (epoch {done} done{inside})", flush=True)
    if note:
        print(note, flush=True)
    if why:
        print(f"--resume: the checkpoint's error-feedback residuals are dropped ({why}): at most one "
              "step's rounding is lost", flush=True)
    return "", saved


def _misfit(args, model: MLP, config: dict, path: Path, saved, saved_config: dict) -> str:
    """Why checkpoint ``path`` cannot go on as this run (a usage error), or "": written for another
    model, or with other training settings and no --resume-changed."""
    if saved_config["sizes"] != config["sizes"] or saved["params"].shape != \
            (model.full_size(),) or str(saved["params"].dtype) != args.dtype:
        return f"{USAGE}:--resume: {path.name} was written for another model: {saved['config']}"
    changed = changed_settings(saved_config, config)
    if changed and not args.resume_changed:
        return (f"{USAGE}:--resume: this run changes the checkpoint's settings ({', '.join(changed)}); "
                "give the same flags, or add --resume-changed to continue with the new ones")
    return ""


def inner_momentum(args, saved: dict, name: str, size: int):
    """Rank 0: where each rank's inner momentum comes from, given checkpoint ``saved`` (``name``)
    of a model of ``size`` parameters. Returns whether each rank takes its own row of
    ``inner_velocities`` back (a checkpoint of ``--inner-state local`` resumed with it on as many
    ranks: the uninterrupted run's bits), the momentum every rank starts from otherwise (None: the
    checkpoint's ``velocity``, which every rank shared after ``--inner-state averaged``'s syncs;
    where the checkpoint holds each rank's own, their average, which no uninterrupted run held),
    and the line to print.

    >>> from types import SimpleNamespace as S
    >>> saved = {"inner_velocities": np.array([[1.0, 2.0], [3.0, 4.0]])}
    >>> own, average, note = inner_momentum(S(inner_state="local"), saved, "c.npz", 2)   # (here col.size() is 1)
    >>> own, average, note
    (False, array([2., 3.]), '--resume: c.npz holds the inner momentum of each of its 2 rank(s) (--inner-state local); on 1 rank(s) every rank starts from their average, which no uninterrupted run held')
    >>> inner_momentum(S(strategy="allreduce"), {}, "c.npz", 2)
    (False, None, '')
    """
    rows = saved.get("inner_velocities")
    if rows is None:
        return False, None, ""
    local = getattr(args, "inner_state", None) == "local"
    if local and rows.shape == (col.size(), size):
        return True, None, ""
    where = f"on {col.size()} rank(s)" if local else "this run shares one momentum:"
    return False, rows.mean(axis=0).astype(rows.dtype), (
        f"--resume: {name} holds the inner momentum of each of its {len(rows)} rank(s) (--inner-state local); "
        f"{where} every rank starts from their average, which no uninterrupted run held")


def load_extras(model: MLP, saved: dict, like_params: dict, residual) -> None:
    """Every rank: the arrays beyond the parameters and momentum from rank 0's ``saved`` checkpoint
    (the others pass {}), zeros where it has none (a checkpoint of another strategy). The residuals
    come back only to as many ranks as wrote them, each its own (``common.save_checkpoint``); on
    another number of ranks (or another layout) they start at zero: a residual is what one rank's
    rounding has not yet delivered, at most one step's, and no rank of the new world owns it.

    >>> load_extras(None, {}, {}, None)   # nothing asked, nothing done
    """
    for name in sorted(like_params):   # (the same order on every rank)
        found = _broadcast_array(saved.get(name), model.flat_params.dtype)
        if found is None:
            like_params[name][...] = 0
        else:
            model.load_full(model.xp.asarray(found), into=like_params[name])
    if residual is None:
        return
    residual[...] = 0
    sizes = _broadcast_array(saved.get("residual_sizes"), np.int64)
    fits = sizes is not None and len(sizes) == col.size() and int(sizes[col.rank()]) == residual.size
    if int(col.allreduce(np.array([fits], np.int64), op="min")[0]):
        rows = _broadcast_array(saved["residuals"] if col.rank() == 0 else None, residual.dtype)
        start = int(sizes[:col.rank()].sum())
        residual[...] = model.xp.asarray(rows[start:start + residual.size])
    elif col.rank() == 0 and sizes is not None:
        print(f"--resume: the checkpoint's error-feedback residuals are of {len(sizes)} rank(s) laid out "
              "otherwise: they start at zero here (at most one step's rounding is dropped)", flush=True)


def _broadcast_array(found, dtype):
    """Rank 0's 1-d array ``found`` (None: none) on every rank, as a numpy array of ``dtype``; None
    on every rank where rank 0 has none."""
    length = np.array([-1 if found is None else np.asarray(found).size], np.int64)
    col.broadcast(length, root=0)
    if length[0] < 0:
        return None
    array = np.asarray(found, dtype).reshape(-1).copy() if col.rank() == 0 else np.empty(int(length[0]), dtype)
    return col.broadcast(array, root=0)


def earlier_records(path: Path | None, epochs_done: int) -> list[dict]:
    """The metrics records of the epochs a resumed run keeps (1..epochs_done), from ``path``; the
    file is cut back to them, so that it stays the record of one run whatever crashed when."""
    if path is None or not path.exists():
        return []
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue   # a line cut short by a crash
        if isinstance(record, dict) and isinstance(record.get("epoch"), int) and record["epoch"] <= epochs_done:
            kept.append(record)
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    return kept

