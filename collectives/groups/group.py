"""Groups: the object that runs collectives, on every rank or on a subset with its own communicator.

A :class:`Group` is a set of ranks with its own communicator, sequence numbers and
cross-rank check, and every collective is one of its methods (as torch's ``ProcessGroup``
and mpi4py's ``Comm``); the world is the group of every rank, and the module-level
functions (``collectives.api``) are the world's methods. ``new_group(ranks)`` and
``split(color, key)`` make others. Ranks inside a group are numbered 0..size()-1 in the
group's order; ``g.ranks`` maps them back to world ranks, which is how error messages name
ranks. A 2 x 2 layout of 4 ranks::

    world rank                0   1   2   3
    split(rank // 2)  group   A   A   B   B      rows: A = [0, 1], B = [2, 3]
                      rank    0   1   0   1
    split(rank % 2)   group   C   D   C   D      columns: C = [0, 2], D = [1, 3]
                      rank    0   0   1   1

Calls on disjoint groups (A and B) run at the same time; a rank alternates between its
groups (A, then C) in the order it issues the calls, which must be an order every rank
of each group agrees with, as for MPI communicators. The settings, the progress engine
and the failure state are the process's (``collectives.calls.runtime.Runtime``): a failed call
on any group stops the runtime on that rank, since it is then out of step with some peers.

Every collective takes ``timeout=`` (seconds, bounding its waiting), ``name=`` (a string, the
same on every rank, that the cross-rank check compares too: ``allreduce(grads, name=f"step
{step}")`` turns a rank that skipped a step into a CollectiveUsageError instead of results
paired with the wrong step) and ``async_op=True`` (returns a ``Work``). The data collectives
take ``algorithm=`` to force one algorithm for that call (``ring.cost.ALGORITHMS``; every rank
must force the same, which the check compares). numpy arrays move over MPI; cupy arrays run the
same ring over NCCL, or staged through host memory over MPI, with the reductions on the GPU, and
return with their work queued on the current CuPy stream.
"""
from __future__ import annotations

from typing import Any

from collectives.ops import bodies, express, personalized, reproducible as exact
from collectives.groups import making
from collectives.calls.call import Call, issue, refusal, stopped
from collectives.calls.runtime import Runtime
from collectives.errors import CollectiveUsageError
from collectives.groups.membership import NonMember, describe
from collectives.groups.transports import Transports
from ring.transport.base import MPIOnlyTransport


class Group:
    """Ranks that make collectives together: ``rank()``, ``size()``, ``ranks`` (world ranks, in
    the group's order) and every collective as a method. ``root`` of a broadcast is a rank of
    the group. It holds its ``transports`` (``collectives.groups.transports``); ``transport`` is the
    host one, which every call's cross-rank check runs on, and ``levels`` its two levels.

    >>> rows = col.split(col.rank() // 2)          # on 4 ranks: [0, 1] and [2, 3]  # doctest: +SKIP
    >>> rows.ranks, rows.rank(), rows.size()       # on world rank 3                # doctest: +SKIP
    ((2, 3), 1, 2)
    >>> rows.allreduce(np.ones(2))                                                  # doctest: +SKIP
    array([2., 2.])
    """

    def __init__(self, runtime: Runtime, transport: MPIOnlyTransport, ranks: tuple[int, ...], world: bool = False,
                 levels: tuple | None = None):
        self.runtime = runtime
        self.transports = Transports(transport, levels, self.where)
        self.transport = transport   # (transports.host, and levels below: read on every call)
        self.levels = levels         # (within a host, across hosts) for the hierarchical all-reduce, or None
        self.ranks = tuple(ranks)
        self.is_world = world
        self.label = "" if world else describe(self.ranks)   # "": the world (messages say nothing more)
        self.seq = 0                 # collectives called on this group so far, the same on every member in step
        self.last = None             # the last of them (a Call: whether it ended in step is its own to say)
        self.destroyed = False       # by destroy(): its communicators are freed
        runtime.groups.append(self)

    def rank(self) -> int:
        """This process's rank in the group, 0..size()-1."""
        return self.transport.rank

    def size(self) -> int:
        """The number of ranks in the group."""
        return self.transport.size

    def where(self) -> str:
        """This rank as messages name it: ``rank 2`` (the world), ``rank 2 in group [0, 2]``."""
        me = f"rank {self.ranks[self.transport.rank]}"
        return f"{me} in {self.label}" if self.label else me

    # The group's counters and state have one owner, this class: a call takes its number here
    # (tests/test_layout.py keeps it so); whether it ended in step, the call itself says.

    def next_call(self, call: Call) -> int:
        """The number of ``call``, now made on this group (1, 2, ...: the same on every member in step)."""
        self.seq += 1
        self.last = call
        return self.seq

    @property
    def completed(self) -> int:
        """The calls on this group that returned, or raised alike on every member: the members are
        in step after the last of them (what a farewell tells the others)."""
        last = self.last
        return 0 if last is None else last.seq if last.in_step else last.seq - 1

    def destroyed_now(self) -> None:
        """``destroy`` freed the group: its communicators go, its calls refuse."""
        self.destroyed = True
        self.runtime.groups.remove(self)
        self.transports.close()

    def give_up(self, why: str, failed: bool = False, root: bool = False, dead: int | None = None) -> None:
        """The runtime stopped on this rank (``Runtime.stop``): tell the other members after which call
        of this group, and ``why``, so that none completes a later call alone (``Control.give_up``)."""
        if not self.destroyed:
            self.transport.control.give_up(self.completed, why, failed, root, dead)

    def lost(self) -> list[int]:
        """The ranks known dead (ended without a farewell, seen here or said in a farewell), as the
        world numbers them: what a change of the world leaves out (``col.elastic``)."""
        return self.transport.control.known_dead()

    def __repr__(self) -> str:
        name = "the world" if self.is_world else self.label
        return f"<Group {name}: rank {self.rank()} of {self.size()}>"

    @property
    def device_transport(self):
        """The transport of this group's cupy arrays (None until the first call on one)."""
        return self.transports.device

    # Making groups from this one, and freeing it (``collectives.groups.making``).

    def split(self, color: int | None, key: int = 0, *, timeout: float | None = None,
              name: str | None = None) -> Any:
        """Split this group into groups by ``color``, as MPI's Comm_split: every member calls it, and
        the ranks that pass the same color form one group, ordered by ``key``, then by rank.

        ``color``: an int >= 0, or None for no group (the rank gets a falsy ``NonMember``).

        >>> rows = col.split(col.rank() // 2)     # 4 ranks: [0, 1] and [2, 3]   # doctest: +SKIP
        >>> cols = col.split(col.rank() % 2)      #          [0, 2] and [1, 3]   # doctest: +SKIP
        """
        return issue(self, "split", making.split, (color, key), False, timeout, name)

    def new_group(self, ranks, *, members_only: bool = False, timeout: float | None = None,
                  name: str | None = None) -> Any:
        """Make a group of the world ranks ``ranks`` (members of this group), in that order (group
        rank i is ``ranks[i]``).

        Every member of this group calls it with the same list; members of the new group get the
        :class:`Group`, the others a falsy ``NonMember``. With ``members_only=True`` only the
        new group's members call it (MPI's Comm_create_group: the others go on with other
        calls), and check on the new group that they agree; that making blocks inside MPI until
        every member has called (as torch.distributed's backends do). Ranks that disagree about
        the list, or a rank making another call, make every rank raise CollectiveUsageError (this
        check is made even with COLLECTIVES_CHECK=0).

        >>> evens = col.new_group(range(0, col.size(), 2))   # doctest: +SKIP
        >>> if evens:                                        # doctest: +SKIP
        ...     evens.allreduce(x)
        """
        if members_only is True:
            made = self.runtime.engine.run_now(making.made_by_members, self, ranks, timeout)
            return issue(made, "new_group", making.agreed, (made.ranks,), False, timeout, name)
        return issue(self, "new_group", making.new_group, (ranks,), False, timeout, name)

    def destroy(self, *, timeout: float | None = None, name: str | None = None) -> None:
        """Free this group's communicators; every member calls it, as MPI_Comm_free and torch's
        ``destroy_process_group``. Afterwards any call on the group raises CollectiveUsageError.
        MPI has a few thousand communicators per process (MPICH: 2048): a program that makes groups
        in a loop destroys the ones it no longer uses.

        >>> pair = col.new_group([0, 1])                     # doctest: +SKIP
        >>> if pair:                                         # doctest: +SKIP
        ...     pair.allreduce(x); pair.destroy()
        """
        return issue(self, "destroy", making.destroy, (), False, timeout, name)

    # The collectives.

    def allreduce(self, x, op: str = "sum", out=None, *, compression: str | None = None, reproducible: bool = False,
                  async_op: bool = False, timeout: float | None = None, name: str | None = None,
                  algorithm: str | None = None) -> Any:
        """Reduce ``x`` elementwise across the group's ranks; every rank gets the same bits.

        ``op`` is "sum", "avg", "min", "max" or "prod". ``out=x`` reduces in place; without ``out`` a new
        array is returned and ``x`` is not modified. The algorithm is the one the cost model (``ring.cost``)
        predicts fastest: recursive doubling, halving and doubling, the ring, or two levels across hosts.

        ``compression``: "bf16" or "fp16" sends float data as 2-byte floats ("sum", "avg", host arrays),
        each element within about n x 2**-8 (bf16) or n x 2**-11 (fp16) of the sum of its contributions'
        magnitudes, the same bits on every rank (docs/api.md).

        ``reproducible=True``: the exact sum of every contribution (``x``, or a list of same-shape arrays),
        rounded once: the same bits at any world size, however dealt (docs/reproducible.md).

        >>> col.allreduce(np.full(3, col.rank() + 1.0))       # on 3 ranks  # doctest: +SKIP
        array([6., 6., 6.])
        >>> col.allreduce(np.full(1 << 20, 0.1, np.float32), compression="bf16")[:2]   # on 2  # doctest: +SKIP
        array([0.2001953, 0.2001953], dtype=float32)
        >>> col.allreduce([np.float32([1e8]), np.float32([1])] if col.rank() else np.float32([-1e8]),
        ...               reproducible=True)                  # on 2: 1e8 + 1 - 1e8, exactly  # doctest: +SKIP
        array([1.], dtype=float32)
        """
        if async_op is False and timeout is None and name is None and compression is None and reproducible is False \
                and (algorithm is None or type(algorithm) is str):
            fused = self.runtime.fused_allreduce
            if fused is not None:
                result = fused(self, x, op, out, algorithm)
                if result is not None:
                    return result
            lane = express.allreduce_lane(self, x, op, out, algorithm)
            if lane is not None:
                return lane.run(x, out)
        body, more = (bodies.allreduce, ()) if reproducible is False else (exact.allreduce, (reproducible,))
        return issue(self, "allreduce", body, (x, op, out, compression, *more), async_op, timeout, name, algorithm)

    def allreduce_many(self, arrays: list, op: str = "sum", *, compression: str | None = None, async_op: bool = False,
                       timeout: float | None = None, name: str | None = None, algorithm: str | None = None) -> Any:
        """All-reduce every array in the list ``arrays`` in place, as one fused operation; returns ``arrays``.

        Arrays of one dtype are packed into one buffer (Horovod's tensor fusion), so many small
        gradients cost one ring, not one each; a dtype with a single contiguous array is reduced
        where it lies. Any shapes; several dtypes are reduced one buffer per dtype, in order of
        first appearance. The arrays must be writable, all numpy or all cupy, and share no memory.
        ``compression``: as for ``allreduce``, for every array (each must be float32, float64 or bfloat16).

        >>> w, b = np.ones((2, 3)), np.arange(3.0)                       # doctest: +SKIP
        >>> col.allreduce_many([w, b], op="avg")                         # doctest: +SKIP
        """
        return issue(self, "allreduce_many", bodies.allreduce_many, (arrays, op, compression), async_op, timeout,
                     name, algorithm)

    def reduce_scatter(self, x, op: str = "sum", out=None, *, async_op: bool = False,
                       timeout: float | None = None, name: str | None = None, algorithm: str | None = None) -> Any:
        """Reduce ``x`` across ranks; return this rank's block of the flattened result.

        Blocks are split like ``np.array_split(x.ravel(), size())`` (``collectives.block_bounds``):
        with 10 elements on 3 ranks, rank 0 gets elements 0-3, rank 1 gets 4-6, rank 2 gets 7-9.

        >>> col.reduce_scatter(np.arange(10.0))               # rank 1 of 3  # doctest: +SKIP
        array([12., 15., 18.])
        """
        return issue(self, "reduce_scatter", bodies.reduce_scatter, (x, op, out), async_op, timeout, name,
                     algorithm)

    def allgather(self, x, out=None, *, async_op: bool = False, timeout: float | None = None,
                  name: str | None = None, algorithm: str | None = None) -> Any:
        """Concatenate every rank's ``x`` along axis 0, in rank order; axis 0 may differ between ranks.

        ``out``: where to write the result (its axis 0 must be the sum over the ranks), instead
        of a new array; it must not overlap ``x``. Writing into the same ``out`` call after call
        saves allocating, which for large results costs more than the transfer (page faults).

        >>> col.allgather(np.full((col.rank() + 1, 2), col.rank()))   # on 2 ranks  # doctest: +SKIP
        array([[0, 0],
               [1, 1],
               [1, 1]])
        """
        if async_op is False and timeout is None and name is None and (algorithm is None or type(algorithm) is str):
            fused = self.runtime.fused_allgather
            if fused is not None:
                result = fused(self, x, None, out, algorithm)
                if result is not None:
                    return result
            lane = express.allgather_lane(self, x, out, algorithm)
            if lane is not None:
                return lane.run(x, out)
        return issue(self, "allgather", bodies.allgather, (x, out), async_op, timeout, name, algorithm)

    def broadcast(self, x, root: int = 0, *, async_op: bool = False, timeout: float | None = None,
                  name: str | None = None, algorithm: str | None = None) -> Any:
        """Overwrite ``x`` on every rank with ``root``'s ``x``, in place; returns ``x``.

        Small buffers travel by recursive doubling inside the cross-rank check's messages; larger
        ones along a pipelined chain around the ring, at nearly one link's bandwidth whatever the
        number of ranks (the cost model chooses: ``ring.cost``).

        >>> params = col.broadcast(params, root=0)                         # doctest: +SKIP
        """
        if async_op is False and timeout is None and name is None and (algorithm is None or type(algorithm) is str):
            fused = self.runtime.fused_broadcast
            if fused is not None:
                result = fused(self, x, root, None, algorithm)
                if result is not None:
                    return result
            lane = express.broadcast_lane(self, x, root, algorithm)
            if lane is not None:
                return lane.run(x)
        return issue(self, "broadcast", bodies.broadcast, (x, root), async_op, timeout, name, algorithm)

    def alltoall(self, x, splits=None, out=None, *, out_splits=None, async_op: bool = False,
                 timeout: float | None = None, name: str | None = None) -> Any:
        """Send block j of ``x`` (rows along axis 0) to rank j, and return the blocks every rank sent
        this one, in rank order. ``splits``: the rows for each rank (None: equal blocks); they may
        differ between ranks, and the result has the rows sent to this rank. ``out``: where to
        write the result instead of a new array (apart from ``x``). ``out_splits``: the rows this
        rank expects from each rank (MPI_Alltoallv's receive counts; None: whatever they send);
        where they are not what the senders send, every rank raises the same CollectiveUsageError.

        >>> col.alltoall(np.arange(4) + 10 * col.rank())     # rank 1 of 2  # doctest: +SKIP
        array([ 2,  3, 12, 13])
        """
        return issue(self, "alltoall", personalized.alltoall, (x, splits, out, out_splits), async_op, timeout, name)

    def gather(self, x, root: int = 0, out=None, *, async_op: bool = False, timeout: float | None = None,
               name: str | None = None) -> Any:
        """Concatenate every rank's ``x`` along axis 0 on ``root`` (as ``allgather``, but on one rank);
        returns the result on the root and None on the others. ``out``: the root's result array
        (another rank may pass one too, say the same code on every rank: it is checked alike and
        left unwritten).

        >>> col.gather(np.full(2, col.rank()), root=0)       # rank 0 of 2  # doctest: +SKIP
        array([0, 0, 1, 1])
        """
        return issue(self, "gather", personalized.gather, (x, root, out), async_op, timeout, name)

    def scatter(self, x, root: int = 0, splits=None, out=None, *, async_op: bool = False,
                timeout: float | None = None, name: str | None = None) -> Any:
        """Give rank j block j of the root's ``x`` (rows along axis 0; ``splits``: the rows for each
        rank, None: equal blocks); returns this rank's block, a numpy array (a cupy ``x`` goes
        through host memory). The other ranks' ``x`` is not read (None will do): the root tells
        them the dtype and shape. ``out``: where to write the block instead of a new array; given
        on every rank, the check compares its dtype and trailing shape across ranks (a rank whose
        ``out`` has other rows than the root's splits give it raises alone, its ``out`` untouched).

        >>> col.scatter(np.arange(4) if col.rank() == 0 else None)    # rank 1 of 2  # doctest: +SKIP
        array([2, 3])
        """
        return issue(self, "scatter", personalized.scatter, (x, root, splits, out), async_op, timeout, name)

    def reduce(self, x, op: str = "sum", root: int = 0, out=None, *, async_op: bool = False,
               timeout: float | None = None, name: str | None = None) -> Any:
        """Reduce ``x`` elementwise across ranks onto ``root`` (as ``allreduce``, but the result only
        there): returns it on the root and None on the others; ``out`` (``out=x``: in place) is
        written on the root only. Large arrays take the ring's reduce-scatter, then a gather.

        >>> col.reduce(np.ones(2), root=1)                   # rank 1 of 3  # doctest: +SKIP
        array([3., 3.])
        """
        return issue(self, "reduce", personalized.reduce, (x, op, root, out), async_op, timeout, name)

    def barrier(self, *, async_op: bool = False, timeout: float | None = None, name: str | None = None) -> Any:
        """Return once every rank has entered the barrier (and checks that they all meant to)."""
        return issue(self, "barrier", bodies.barrier, (), async_op, timeout, name)

    def refuse(self, collective: str, problem: str, *, async_op: bool = False, timeout: float | None = None) -> Any:
        """Take this rank's turn in ``collective`` as a refusal: this rank raises
        CollectiveUsageError(``problem``), and so does every other rank of the group in its own
        call of ``collective``, with ``problem`` and this rank named, instead of waiting for this
        one. For adapters that check what the runtime cannot see (``collectives.torch`` checks
        the sizes of torch's tensor lists); ``problem`` should name the collective and the argument.

        >>> col.refuse("allgather", "all_gather: tensor_list: expected 3 tensors, got 2")  # doctest: +SKIP
        """
        return issue(self, collective, refusal(CollectiveUsageError(problem)), (), async_op, timeout)

    def algorithm_for(self, collective: str, x) -> str:
        """The algorithm a call of ``collective`` on ``x`` would run here, forcing none (the same on
        every rank): "doubling", "halving", "ring" or "hierarchical". Local: no message.

        >>> col.algorithm_for("allreduce", np.zeros(2, np.float32))      # doctest: +SKIP
        'doubling'
        """
        return bodies.predicted(self, collective, x)


def member(group: object, collective: str, runtime: Runtime) -> Group:
    """``group=`` of a call: a Group of ``runtime`` this rank belongs to; anything else is this
    rank's usage error (raised here alone: the members of a group it is not in are not waiting)."""
    if isinstance(group, NonMember):
        raise group.refusal(collective)
    if not isinstance(group, Group):
        raise CollectiveUsageError(f"{collective}: group: expected a collectives.Group (from new_group or split) "
                                   f"or None for the world, got {type(group).__name__}")
    if group.runtime is not runtime and group.runtime.retired is not None:
        raise stopped(collective, group.runtime)   # (a group of the world before a change: MembershipChanged)
    if group.runtime is not runtime:
        raise CollectiveUsageError(f"{collective}: group: {group.label} belongs to another runtime")
    if group.destroyed:
        raise CollectiveUsageError(f"{collective}: group: {group.label} was destroyed (Group.destroy())")
    return group
