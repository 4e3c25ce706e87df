"""What both training strategies share (``trainer/__main__.py`` and ``trainer/strategies/``):
rank 0's messages, the usage error every rank agrees on, scoring, the epoch line, checkpoints."""
from __future__ import annotations

import json

import numpy as np

import collectives as col
from cmdline import interrupt
from cmdline.parser import FAULT, INTERRUPTED, PREEMPTED, USAGE
from trainer import checkpoint
from trainer.layout import Layout
from trainer.model import MLP
from trainer.optim import SGD


def say(*parts) -> None:
    if col.rank() == 0:
        print(*parts, flush=True)


class UsageExit(Exception):
    """A problem every rank agrees on: print it on rank 0 and exit with ``status`` everywhere."""

    def __init__(self, message: str, status: int = USAGE):
        super().__init__(message)
        self.status = status


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: every rank stopped at the same point (``cmdline.interrupt``); rank 0
    says where, and which checkpoint a ``--resume`` continues from (``saved``: what it covers,
    e.g. "epoch 3" or "step 40"; None: none). ``status``: 130 after Ctrl-C, 143 after SIGTERM
    (a preemption: the batch script requeues the job, and ``--resume`` goes on)."""

    def __init__(self, where: str, saved: str | None, checkpoint_dir, preempted: bool = False):
        if saved:
            after = f"the last checkpoint is {saved}: --resume continues from it"
        elif checkpoint_dir:
            after = f"no checkpoint was written yet in {checkpoint_dir}"
        else:
            after = "no checkpoint was written (--checkpoint-dir)"
        super().__init__(f"{'preempted (SIGTERM)' if preempted else 'interrupted'} at {where}; {after}")
        self.status = PREEMPTED if preempted else INTERRUPTED


def steps_per_epoch(dataset, batch_size: int) -> int:
    """Global batches in one epoch of ``dataset`` (the last one may be short).

    >>> from types import SimpleNamespace
    >>> steps_per_epoch(SimpleNamespace(train_y=range(1438)), 64)
    23
    """
    return -(-len(dataset.train_y) // batch_size)


def stop_requested(group: col.Group | None = None) -> int:
    """What any rank of ``group`` (None: the world) was asked (``cmdline.interrupt.requested``: 0,
    CTRL_C or PREEMPTED, the largest): one small all-reduce."""
    return interrupt.agreed(int(col.allreduce(np.array([interrupt.requested()], np.int8), op="max", group=group,
                                              name="Ctrl-C?")[0]))


def accuracy(model: MLP, x: np.ndarray, y: np.ndarray, layout: Layout) -> float:
    """Each replica scores its share; the counts are summed exactly (int64)."""
    mine = model.xp.asarray(np.array_split(np.arange(len(y)), layout.dp_size)[layout.dp_rank])
    correct = np.array([int((model.logits(x[mine]).argmax(axis=1) == y[mine]).sum())], np.int64)
    return float(col.allreduce(correct, group=layout.dp)[0]) / len(y)


def save_checkpoint(args, model: MLP, opt: SGD, epoch: int, step: int, config: dict, partial: bool = False,
                    like_params: dict | None = None, residual=None) -> None:
    """Every rank: the whole model is gathered (over the tensor-parallel group, if any); rank 0 writes
    it. ``partial``: at global ``step``, inside the epoch after ``epoch`` (``--max-steps``).
    ``like_params``: more arrays laid out like the parameters (DiLoCo's outer momentum), gathered
    alike. ``residual``: this rank's error-feedback residual (``--compression``): every rank's, in
    rank order, as ``residuals`` with their sizes in ``residual_sizes`` (a resume on as many ranks
    gives each its own back)."""
    host = {"params": model.to_full(model.flat_params), "velocity": model.to_full(opt.velocity),
            **{name: model.to_full(a) for name, a in (like_params or {}).items()}}
    if residual is not None:   # (each rank's own: gathered from the whole world, whatever the layout)
        host["residuals"] = col.allgather(residual)
        host["residual_sizes"] = col.allgather(np.array([residual.size], np.int64))
    if col.rank() != 0:
        return
    host = {name: col.to_host(a) for name, a in host.items()}
    try:
        checkpoint.save(args.checkpoint_dir, epoch + 1, step, host, config, args.keep, partial)
    except OSError as e:   # a full disk, say: the run stops with the last good checkpoint in place
        raise UsageExit(f"--checkpoint-dir {args.checkpoint_dir}: cannot write the checkpoint of epoch "
                        f"{epoch + 1}: {e.strerror or e}", FAULT) from e


def epoch_record(epoch: int, step: int, loss: float, model: MLP, dataset, layout: Layout, elapsed: float,
                 steps: int, comm_s: float, exposed_s: float, arrangement: str) -> dict:
    """What every strategy records of an epoch (0-based ``epoch``, just ended after ``steps`` steps
    in ``elapsed`` seconds): the model scored by the ranks of ``layout``, times per step, and how
    the ranks were arranged. Each strategy adds its own keys. A loss that is not finite (the same
    on every rank: it is all-reduced) stops the run on every rank, before this epoch's checkpoint."""
    if not np.isfinite(loss):
        raise UsageExit(f"the training loss is {loss} after epoch {epoch + 1}: the model diverged (try a smaller "
                        "--lr); no checkpoint was written for this epoch", FAULT)
    return {"epoch": epoch + 1, "step": step, "loss": loss,
            "train_accuracy": accuracy(model, dataset.train_x, dataset.train_y, layout),
            "test_accuracy": accuracy(model, dataset.test_x, dataset.test_y, layout),
            "samples_per_sec": len(dataset.train_y) / elapsed, "step_time": elapsed / steps,
            "comm_time": comm_s / steps, "exposed_comm_time": exposed_s / steps, "layout": arrangement}


def epoch_line(record: dict, epochs: int) -> str:
    """The line rank 0 prints after each epoch (the record's optional fields only when present)."""
    line = (f"epoch {record['epoch']:3d}/{epochs}  loss {record['loss']:.4f}  train {record['train_accuracy']:6.2%}  "
            f"test {record['test_accuracy']:6.2%}  {record['samples_per_sec']:9.0f} samples/s  "
            f"step {record['step_time'] * 1e3:6.2f} ms  comm {record['comm_time'] / record['step_time']:5.1%}  "
            f"exposed {record['exposed_comm_time'] / record['step_time']:5.1%}")
    if "staleness_mean" in record:
        line += f"  staleness {record['staleness_mean']:.2f} (max {record['staleness_max']})"
    return line + f"  {record['layout']}"


class EpochLog:
    """Rank 0's account of each epoch: the printed line, one JSON object in ``--metrics``, and with
    ``--tensorboard`` every number of the record as a TensorBoard scalar (tag: the record's key,
    step: the epoch), written by tensorboardX. Other ranks write nothing."""

    def __init__(self, args, resumed: bool):
        self.args, self.epochs = args, args.epochs
        mine = col.rank() == 0
        self.metrics = open(args.metrics, "a" if resumed else "w") if args.metrics and mine else None
        self.board = None
        if args.tensorboard and mine:
            from tensorboardX import SummaryWriter   # (checked by parse_args)
            self.board = SummaryWriter(str(args.tensorboard))

    def reopen(self) -> None:
        """After a change of the world (``--elastic``): the files go on, appended to, by whichever
        process is rank 0 now."""
        if col.rank() == 0 and self.metrics is None and self.args.metrics:
            self.metrics = open(self.args.metrics, "a")
        if col.rank() == 0 and self.board is None and self.args.tensorboard:
            from tensorboardX import SummaryWriter
            self.board = SummaryWriter(str(self.args.tensorboard))

    def write(self, record: dict) -> None:
        say(epoch_line(record, self.epochs))
        if self.metrics:
            self.metrics.write(json.dumps(record) + "\n")
            self.metrics.flush()
        if self.board:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("epoch", "step"):
                    self.board.add_scalar(key, value, record["epoch"])
            self.board.flush()

    def close(self) -> None:
        for output in (self.metrics, self.board):
            if output:
                output.close()
