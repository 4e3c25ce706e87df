"""Parameter-server training (TensorFlow's ParameterServerStrategy), beside the all-reduce loop.

The last S ranks are servers, each holding one shard of the flat parameter vector (split by
size, ``np.array_split``-style) and its momentum; the other W = n - S ranks are workers.
A worker loops: pull the parameters (a request to every server, then every shard received
at once), compute the gradient of its share of the batch, push each server its shard of it.
A server applies gradients with the optimizer as they arrive. Rank 0, a worker, is the
chief: at the end of each epoch it takes a snapshot of the servers' state, evaluates,
prints and checkpoints. Messages are raw arrays over the runtime's point-to-point calls
(``collectives.p2p``), under its timeouts and departure rules.

Staleness: a gradient's staleness is the number of updates its server applied between the
worker's pull and the gradient's arrival. ``--max-staleness K`` (stale-synchronous parallel)
holds a worker's pull for its step c until every worker has pushed at least c - K gradients;
``K = 0`` is synchronous training: each server sums the W gradients of a step in worker order
and applies them as one update, which is all-reduce training with the same global batch.
Unbounded (the default), workers never wait for each other. 2 workers, K = 1::

    worker 0:  pull(c=0) push  pull(c=1) push  pull(c=2): waits until worker 1 has pushed 1
    worker 1:  pull(c=0) ........ slow ........ push  -> worker 0 goes on

Messages (int64 headers on tag HEADER, then the arrays): a worker sends PULL (its step and
requirement), PUSH (the version it pulled, then its gradient shard on tag GRADIENT), SNAPSHOT
(the chief), DONE. A server answers PULL with (version, Ctrl-C pressed there?, params) and SNAPSHOT with (version,
params, velocity, statistics); after every worker's DONE it sends the chief its final
snapshot and leaves its loop.
"""
from __future__ import annotations

import time

import numpy as np

import collectives as col
from cmdline import interrupt
from trainer.common import EpochLog, Interrupted, UsageExit, epoch_record, save_checkpoint, steps_per_epoch
from trainer.layout import Layout
from trainer.optim import SGD

PULL, PUSH, SNAPSHOT, DONE = 1, 2, 3, 4
HEADER, GRADIENT, PARAMS, STATE = 1, 2, 3, 4   # tags
_STATISTICS = 5   # staleness sum, count, max, bytes moved, seconds since the last snapshot


class Roles:
    """Who is who: ``servers`` (world ranks, the last S), ``workers`` (the others, rank 0 the chief),
    and each server's shard of the flat parameters.

    >>> r = Roles(5, 2, 103)
    >>> r.workers, r.servers, r.shards
    ([0, 1, 2], [3, 4], ((0, 52), (52, 103)))
    """

    def __init__(self, n: int, servers: int, parameters: int):
        self.workers = list(range(n - servers))
        self.servers = list(range(n - servers, n))
        self.shards = col.block_bounds(parameters, servers)

    def describe(self) -> str:
        return f"{len(self.servers)} server(s), {len(self.workers)} worker(s) (ps)"


def check_flags(args, n: int) -> None:
    """The flags fit this world (the same verdict on every rank)."""
    if n < 2:
        raise UsageExit("--strategy ps: needs at least 2 ranks (a server and a worker); run under mpiexec -n N")
    if not 1 <= args.servers < n:
        raise UsageExit(f"--servers {args.servers}: expected 1 to {n - 1} with {n} ranks (at least one worker)")
    if args.tensor_parallel != 1:
        raise UsageExit("--tensor-parallel: not with --strategy ps")


def train(args, dataset, config: dict, model, opt: SGD, start: int, step: int, log: EpochLog) -> list[dict]:
    """Every rank: serve or work until every epoch is done; return the chief's records. Ctrl-C or
    SIGTERM stops the workers together at the end of an epoch (they meet there), which the chief
    then treats as the last one (its checkpoint written); every rank raises ``Interrupted``."""
    roles = Roles(col.size(), args.servers, model.flat_params.size)
    workers = col.split(0 if col.rank() in roles.workers else None)
    chief = col.new_group([0])   # (the chief scores the model alone)
    if start >= args.epochs:
        return []
    per_epoch = steps_per_epoch(dataset, args.batch_size)
    history, stopped_at = [], 0
    if col.rank() in roles.servers:
        index = roles.servers.index(col.rank())
        Server(args, roles, index, model, opt, start * per_epoch).serve()
    else:
        worker = Worker(args, roles, workers, chief, model, opt)
        history, stopped_at = worker.run(dataset, config, start, step, log), worker.stopped_at
    # whether Ctrl-C ended the run early reaches every rank in a collective: nobody leaves while another waits for it
    stopped, asked = (int(v) for v in col.allreduce(np.array([stopped_at, interrupt.requested()]), op="max",
                                                      name="parameter servers done"))
    interrupt.agreed(asked)
    if stopped:
        raise Interrupted(f"the end of epoch {stopped}", f"epoch {stopped}" if args.checkpoint_dir else None,
                          args.checkpoint_dir, preempted=asked == interrupt.PREEMPTED)
    return history


class Server:
    """One shard's parameters and momentum, updated as gradients arrive."""

    def __init__(self, args, roles: Roles, index: int, model, opt: SGD, first_step: int):
        start, stop = roles.shards[index]
        self.workers = roles.workers
        self.params = np.array(model.flat_params[start:stop])
        self.opt = SGD(self.params, args.lr, args.momentum, args.weight_decay)
        self.opt.velocity[...] = opt.velocity[start:stop]
        self.max_staleness = args.max_staleness
        self.synchronous = args.max_staleness == 0
        self.clocks = {w: first_step for w in roles.workers}        # gradients received from each worker
        self.version = first_step if self.synchronous else first_step * len(roles.workers)   # updates applied
        self.round = {}                                             # synchronous: this step's gradients
        self.pending: list[tuple[int, int, int]] = []               # (worker, kind, requirement)
        self.statistics = np.zeros(_STATISTICS)
        self.since = time.perf_counter()

    def serve(self) -> None:
        header, gradient, done = np.zeros(4, np.int64), np.empty_like(self.params), set()
        heard = {w: time.monotonic() for w in self.workers}
        while len(done) < len(self.workers):
            try:
                worker = col.recv(header, None, HEADER)
            except col.CollectiveError as e:
                if "timed out" not in str(e):
                    raise
                silent = self._silent(heard, done)
                raise col.CollectiveError(f"{e}; the server heard nothing from worker rank {silent} for "
                                          f"{time.monotonic() - heard[silent]:.1f} s") from e
            heard[worker] = time.monotonic()
            kind, number = int(header[0]), int(header[1])
            if kind == PUSH:
                col.recv(gradient, worker, GRADIENT)
                self.statistics[3] += gradient.nbytes
                self._apply(worker, number, gradient)
            elif kind in (PULL, SNAPSHOT):
                self.pending.append((worker, kind, number))
            elif kind == DONE:
                done.add(worker)
            self._answer()
        self._send_state(0, final=True)

    def _silent(self, heard: dict[int, float], done: set[int]) -> int:
        """The worker to name when no message came in time: of those not waiting on this server (a
        worker with a request pending here is blocked on us, not stalled), the one heard from longest
        ago. The times alone would mislead: a queued message is heard when read, not when sent."""
        waiting = {worker for worker, _, _ in self.pending}
        running = [w for w in heard if w not in done]
        return min([w for w in running if w not in waiting] or running, key=heard.get)

    def _apply(self, worker: int, pulled: int, gradient: np.ndarray) -> None:
        self.clocks[worker] += 1
        if not self.synchronous:
            self._note_staleness(self.version - pulled)
            self.opt.step(gradient)
            self.version += 1
            return
        self.round[worker] = gradient.copy()
        if len(self.round) == len(self.workers):   # every worker's gradient of this step: one update
            total = self.round[self.workers[0]]
            for w in self.workers[1:]:
                total += self.round[w]
            self.opt.step(total)
            self.version += 1
            self.round = {}
            for _ in self.workers:
                self._note_staleness(0)

    def _note_staleness(self, staleness: int) -> None:
        self.statistics[0] += staleness
        self.statistics[1] += 1
        self.statistics[2] = max(self.statistics[2], staleness)

    def _ready(self, requirement: int) -> bool:
        if self.synchronous:
            return self.version >= requirement
        if self.max_staleness is None:
            return True
        return min(self.clocks.values()) >= requirement - self.max_staleness

    def _answer(self) -> None:
        waiting = []
        for worker, kind, requirement in self.pending:
            if not self._ready(requirement):
                waiting.append((worker, kind, requirement))
            elif kind == PULL:   # (with this server's Ctrl-C, which only the workers' epoch end can act on)
                col.send(np.array([self.version, interrupt.requested()], np.int64), worker, PARAMS)
                col.send(self.params, worker, PARAMS)
                self.statistics[3] += self.params.nbytes
            else:
                self._send_state(worker)
        self.pending = waiting

    def _send_state(self, worker: int, final: bool = False) -> None:
        now = time.perf_counter()
        self.statistics[4] = now - self.since
        col.send(np.array([self.version, int(final)], np.int64), worker, STATE)
        col.send(self.params, worker, STATE)
        col.send(self.opt.velocity, worker, STATE)
        col.send(self.statistics, worker, STATE)
        self.statistics[:] = 0
        self.since = now


class Worker:
    """A worker's side of the protocol, and the chief's evaluation, printing and checkpoints."""

    def __init__(self, args, roles: Roles, workers: col.Group, chief, model, opt: SGD):
        self.args, self.roles, self.group, self.model, self.opt = args, roles, workers, model, opt
        self.index = workers.rank()
        self.chief = col.rank() == 0
        self.alone = Layout(None, chief, 0, 1) if self.chief else None   # the chief scores on its own
        self.versions = np.zeros(len(roles.servers), np.int64)   # the version of each shard pulled last
        self.stopped_at = 0   # the epoch at whose end Ctrl-C stopped the workers (0: none)
        self.server_interrupted = False   # a server had Ctrl-C (its answers to pulls say so)

    def pull(self, step: int) -> None:
        """Every shard of the parameters, once the servers let this worker's ``step`` go ahead."""
        header = np.array([PULL, step, 0, 0], np.int64)
        for server in self.roles.servers:
            col.send(header, server, HEADER)
        versions = [np.zeros(2, np.int64) for _ in self.roles.servers]
        flat = self.model.flat_params
        requests = []
        for s, (server, (start, stop)) in enumerate(zip(self.roles.servers, self.roles.shards)):
            requests.append(col.irecv(versions[s], server, PARAMS))
            requests.append(col.irecv(flat[start:stop], server, PARAMS))
        col.wait_all(requests)
        self.versions[:] = [v[0] for v in versions]
        self.server_interrupted = self.server_interrupted or any(v[1] for v in versions)

    def push(self) -> None:
        grads = self.model.flat_grads
        for s, (server, (start, stop)) in enumerate(zip(self.roles.servers, self.roles.shards)):
            col.send(np.array([PUSH, self.versions[s], 0, 0], np.int64), server, HEADER)
            col.send(grads[start:stop], server, GRADIENT)

    def state(self, requirement: int | None, final: bool = False) -> tuple[int, np.ndarray]:
        """The chief: every server's parameters and momentum (into the model and optimizer); returns
        the updates applied and the servers' statistics (one row each)."""
        if not final:
            for server in self.roles.servers:
                col.send(np.array([SNAPSHOT, requirement, 0, 0], np.int64), server, HEADER)
        rows, updates = [], 0
        for server, (start, stop) in zip(self.roles.servers, self.roles.shards):
            header, statistics = np.zeros(2, np.int64), np.zeros(_STATISTICS)
            col.recv(header, server, STATE)
            col.recv(self.model.flat_params[start:stop], server, STATE)
            col.recv(self.opt.velocity[start:stop], server, STATE)
            col.recv(statistics, server, STATE)
            updates = max(updates, int(header[0]))
            rows.append(statistics)
        return updates, np.array(rows)

    def run(self, dataset, config: dict, start: int, step: int, log: EpochLog) -> list[dict]:
        args, model = self.args, self.model
        n_train, history = len(dataset.train_y), []
        for epoch in range(start, args.epochs):
            order = np.random.default_rng([args.seed, epoch]).permutation(n_train)
            loss_sum, comm_s, steps, began = 0.0, 0.0, 0, time.perf_counter()
            for first in range(0, n_train, args.batch_size):
                batch = order[first: first + args.batch_size]
                shard = np.array_split(batch, len(self.roles.workers))[self.index]
                waited = time.perf_counter()
                self.pull(step)
                comm_s += time.perf_counter() - waited
                loss_sum += model.loss_and_grads(dataset.train_x[shard], dataset.train_y[shard], 1.0 / len(batch))
                waited = time.perf_counter()
                self.push()
                comm_s += time.perf_counter() - waited
                steps, step = steps + 1, step + 1
            elapsed = time.perf_counter() - began
            stop = interrupt.requested() or self.server_interrupted
            loss_sum, stop = col.allreduce(np.array([loss_sum, stop]), group=self.group)
            loss = float(loss_sum) / n_train
            self.stopped_at = epoch + 1 if stop else 0
            if not self.chief:
                if stop:
                    break
                continue
            last = epoch + 1 == args.epochs or stop
            if last:
                self.done()   # (then the servers' final state comes unasked)
            updates, statistics = self.state(step, final=last)
            history.append(self._record(epoch, step, loss, dataset, elapsed, steps, comm_s, updates, statistics))
            log.write(history[-1])
            if args.checkpoint_dir and ((epoch + 1) % args.checkpoint_every == 0 or last):
                save_checkpoint(args, model, self.opt, epoch, step, config)
            if last:
                break
        if not self.chief:
            self.done()
        return history

    def done(self) -> None:
        """Tell every server that this worker has pushed its last gradient."""
        for server in self.roles.servers:
            col.send(np.array([DONE, 0, 0, 0], np.int64), server, HEADER)

    def _record(self, epoch, step, loss, dataset, elapsed, steps, comm_s, updates, statistics) -> dict:
        count = statistics[:, 1].sum()
        return {**epoch_record(epoch, step, loss, self.model, dataset, self.alone, elapsed, steps, comm_s, comm_s,
                               self.roles.describe()), "strategy": "ps",
                "staleness_mean": float(statistics[:, 0].sum() / count) if count else 0.0,
                "staleness_max": int(statistics[:, 2].max()), "updates": updates,
                "server_bytes_per_sec": [float(row[3] / row[4]) if row[4] else 0.0 for row in statistics]}
