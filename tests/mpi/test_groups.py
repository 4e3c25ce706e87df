"""Tier 2: collectives on groups (split, new_group) against mpi4py's own on the matching Comm.Split.

tests/test_worlds.py runs this file under mpiexec -n 1..4: parity groups (even at n=2 and 4,
uneven at n=3), a singleton group, a reversed order, disjoint groups at once, and
overlapping groups in alternation, with rank-dependent inputs.
"""
import re

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from ring.partition import chunk_bounds
from tests.support.in_world import agree


pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
LARGE = 20_000   # float64 elements: 160 KB, past the latency path (the ring)

#: name -> (color, key) of this rank: the splits every conformance test runs on.
SPLITS = {
    "parity": lambda r: (r % 2, r),
    "singleton": lambda r: (0 if r == 0 else 1, r),
    "reversed": lambda r: (0, -r),
    "halves": lambda r: (r * 2 // N, r),
}


@pytest.fixture(params=list(SPLITS), scope="module")
def pair(request):
    """(our group, mpi4py's communicator over the same ranks in the same order)."""
    color, key = SPLITS[request.param](RANK)
    return col.split(color, key), COMM.Split(color, key)


def values(count, dtype, salt=0):
    i = np.arange(np.prod(count))
    return ((i * 7 + RANK * 13 + salt) % 11 + 1).astype(dtype)


def same_in(comm, result) -> bool:
    """The same bytes on every rank of ``comm``."""
    everyone = comm.allgather(np.ascontiguousarray(result).tobytes())
    return all(b == everyone[0] for b in everyone)


def test_a_group_knows_its_ranks_in_world_numbers(pair):
    group, comm = pair
    world_ranks = tuple(comm.allgather(RANK))
    agree(group.ranks == world_ranks and group.rank() == comm.Get_rank() and group.size() == comm.Get_size(),
          f"group {group.ranks} rank {group.rank()} vs MPI's {world_ranks} rank {comm.Get_rank()}")


@pytest.mark.parametrize("op", ["sum", "max", "avg"])
@pytest.mark.parametrize("count", [1, 7, LARGE])
def test_allreduce_on_a_group_equals_mpis(pair, op, count):
    group, comm = pair
    x = values(count, np.float64)
    expected = np.empty_like(x)
    comm.Allreduce(x, expected, op=MPI.MAX if op == "max" else MPI.SUM)
    if op == "avg":
        expected /= comm.Get_size()
    ours = group.allreduce(x, op=op)
    agree(np.allclose(ours, expected, rtol=1e-12) and same_in(comm, ours),
          f"allreduce {op} on {group.ranks}")
    module_level = col.allreduce(x, op=op, group=group, async_op=True).wait()
    agree(np.array_equal(module_level, ours), "module-level and async allreduce on a group")


def test_allreduce_many_on_a_group_equals_mpis(pair):
    group, comm = pair
    arrays = [values(5, np.float32), values(LARGE, np.float64, 1), values((3, 4), np.int32, 2).reshape(3, 4)]
    expected = [np.empty_like(a) for a in arrays]
    for a, e in zip(arrays, expected):
        comm.Allreduce(a, e)
    group.allreduce_many(arrays)
    agree(all(np.array_equal(a, e) for a, e in zip(arrays, expected)), f"allreduce_many on {group.ranks}")


@pytest.mark.parametrize("count", [0, 5, LARGE + 3])
def test_reduce_scatter_on_a_group_equals_mpis(pair, count):
    group, comm = pair
    x = values(count, np.int64)
    bounds = chunk_bounds(count, comm.Get_size())
    expected = np.empty(bounds[comm.Get_rank()][1] - bounds[comm.Get_rank()][0], np.int64)
    comm.Reduce_scatter(x, expected, [stop - start for start, stop in bounds])
    agree(np.array_equal(group.reduce_scatter(x), expected), f"reduce_scatter of {count} on {group.ranks}")


@pytest.mark.parametrize("rows", [1, LARGE // 4])
def test_allgather_on_a_group_equals_mpis(pair, rows):
    group, comm = pair
    x = values((rows + comm.Get_rank()) * 2, np.float32).reshape(-1, 2)   # axis 0 differs between ranks
    counts = comm.allgather(x.size)
    expected = np.empty((sum(counts) // 2, 2), np.float32)
    comm.Allgatherv(x, [expected, counts])
    agree(np.array_equal(group.allgather(x), expected), f"allgather on {group.ranks}")


@pytest.mark.parametrize("count", [3, LARGE])
def test_broadcast_from_a_groups_last_rank_equals_mpis(pair, count):
    group, comm = pair
    root = comm.Get_size() - 1   # a rank of the group, not of the world
    x = values(count, np.float64)
    expected = x.copy()
    comm.Bcast(expected, root=root)
    group.broadcast(x, root=root)
    group.barrier()
    agree(np.array_equal(x, expected), f"broadcast from group rank {root} on {group.ranks}")


def test_disjoint_groups_run_at_once_each_with_its_own_data():
    """Every rank in one of two groups; 20 async all-reduces each, all in flight together."""
    group = col.split(RANK % 2)
    members = [r for r in range(N) if r % 2 == RANK % 2]
    handles = [group.allreduce(np.full(1000 * (k % 3 + 1), RANK + k, np.int64), async_op=True) for k in range(20)]
    results = [h.wait() for h in handles]
    agree(all(np.all(res == sum(r + k for r in members)) for k, res in enumerate(results)),
          "disjoint groups' results")


def test_overlapping_groups_in_alternation_with_the_world():
    """Rows and columns of a grid, and the world, one call after another with handles in flight."""
    width = 2 if N >= 2 else 1
    rows, columns = col.split(RANK // width), col.split(RANK % width)
    row_members = [r for r in range(N) if r // width == RANK // width]
    column_members = [r for r in range(N) if r % width == RANK % width]
    pending = []
    for step in range(6):
        pending.append((rows.allreduce(np.full(LARGE, RANK + step, np.float64), async_op=True),
                        sum(r + step for r in row_members)))
        pending.append((columns.allreduce(np.full(3, RANK * step, np.float64)), sum(r * step for r in column_members)))
        pending.append((col.allreduce(np.full(5, step, np.float64), async_op=True), N * step))
    results = [(h.wait() if isinstance(h, col.Work) else h, want) for h, want in pending]
    agree(all(np.all(res == want) for res, want in results), "rows, columns and the world alternating")


def test_new_group_keeps_the_order_given():
    order = list(reversed(range(N)))
    group = col.new_group(order)
    agree(bool(group) and group.ranks == tuple(order) and group.rank() == N - 1 - RANK, "reversed new_group")
    gathered = group.allgather(np.array([RANK]))
    agree(list(gathered) == order, f"allgather in the group's order: {list(gathered)}")


def test_a_group_of_some_ranks_leaves_the_others_out():
    group = col.new_group([0])
    if RANK == 0:
        ok = bool(group) and group.size() == 1 and np.array_equal(group.allreduce(np.arange(4)), np.arange(4))
    else:
        ok = not group and group.rank() == -1 and group.ranks == (0,)
    agree(ok, f"rank {RANK}: {group!r}")
    col.barrier()


def test_a_group_of_a_group():
    halves = col.split(RANK * 2 // N)
    inner = halves.split(halves.rank() % 2)
    expected = [r for r in halves.ranks if halves.ranks.index(r) % 2 == halves.rank() % 2]
    agree(inner.ranks == tuple(expected), f"split of {halves.ranks}: {inner.ranks}")
    agree(np.all(inner.allreduce(np.full(2, RANK)) == sum(expected)), "allreduce on a group of a group")
    sub = halves.new_group(halves.ranks[:1])
    agree(bool(sub) == (RANK == halves.ranks[0]), "new_group of a group's first rank")


def test_split_with_no_color_gives_a_non_member():
    group = col.split(None if RANK == 0 else 0)
    if RANK == 0:
        agree(not group, "color=None: no group")
        with pytest.raises(col.CollectiveUsageError, match=r"allreduce: group: rank 0 is not a member of a split"):
            col.allreduce(np.ones(2), group=group)
    else:
        agree(group.ranks == tuple(range(1, N)), f"the rest: {group.ranks}")
        group.barrier()


def _raised_everywhere(call, match: str) -> None:
    """``call()`` raises CollectiveUsageError matching ``match`` on every rank (and they stay in step)."""
    try:
        call()
    except col.CollectiveUsageError as e:
        ok, text = re.search(match, str(e)) is not None, str(e)
    else:
        ok, text = False, "no error"
    agree(ok, f"rank {RANK}: expected /{match}/, got: {text}")
    agree(np.all(col.allreduce(np.ones(2)) == N), "still in step afterwards")


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
def test_ranks_that_disagree_about_a_groups_members_all_raise():
    ranks = [0] if RANK == 0 else list(range(N))
    _raised_everywhere(lambda: col.new_group(ranks),
                       r"new_group: ranks: members differs across ranks: rank 0: \(0,\), rank 1: \(0, 1")


@pytest.mark.skipif(N < 2, reason="needs two ranks to differ")
def test_a_group_made_on_some_ranks_only_raises_on_every_rank():
    _raised_everywhere(lambda: col.new_group([0]) if RANK % 2 == 0 else col.barrier(),
                       r"collective differs across ranks: rank 0: new_group, rank 1: barrier")


@pytest.mark.parametrize("ranks, problem", [
    ([0, 0], r"rank\(s\) \[0\] appear more than once"),
    ([0, 99], r"rank\(s\) \[99\] are not in the world"),
    ([], "is empty"),
    (["0"], "expected an int, got str"),
    (3, "expected a list of ranks, got int"),
])
def test_bad_members_are_refused_on_every_rank(ranks, problem):
    _raised_everywhere(lambda: col.new_group(ranks), "new_group: ranks: " + problem)


@pytest.mark.skipif(N < 2, reason="needs a rank whose argument alone is wrong")
def test_one_ranks_bad_color_is_raised_on_every_rank():
    color = -1 if RANK == N - 1 else 0
    _raised_everywhere(lambda: col.split(color), r"split: color: expected an int >= 0 or None \(no group\), got -1")


def test_a_root_outside_the_group_is_refused():
    group = col.split(RANK % 2)
    _raised_everywhere(lambda: group.broadcast(np.ones(3), root=group.size()),
                       rf"broadcast: root: rank {group.size()} is out of range for a group of {group.size()}")


def test_a_bad_group_argument_is_this_ranks_usage_error():
    with pytest.raises(col.CollectiveUsageError, match="allreduce: group: expected a collectives.Group"):
        col.allreduce(np.ones(2), group="world")


@pytest.mark.skipif(N < 2, reason="needs two ranks")
def test_a_mismatch_on_a_group_names_world_ranks_and_the_group():
    group = col.new_group([N - 1, 0])   # group rank 0 is world rank N-1
    if group:
        count = 3 if RANK == 0 else 4
        try:
            group.allreduce(np.ones(count))
        except col.CollectiveUsageError as e:
            text = str(e)
        else:
            text = "no error"
        expected = f"allreduce on group [{N - 1}, 0]: x: count differs across ranks: rank {N - 1}: 4, rank 0: 3"
        ok = text == expected
    else:
        ok, text, expected = True, "", ""
    agree(ok, f"rank {RANK}: {text!r} != {expected!r}")


def test_a_group_made_by_its_members_alone_equals_mpis():
    """members_only=True: the last ranks make a group (in reverse order) while the first ranks
    make theirs; each sums on its own, against mpi4py's on the same ranks."""
    members = list(range(N - 1, N // 2 - 1, -1))   # n=4: [3, 2]; n=1: [0]
    inside = RANK in members
    comm = COMM.Split(0 if inside else 1, -RANK)
    x = values(LARGE, np.float64)
    expected = np.empty_like(x)
    comm.Allreduce(x, expected)
    mine = members if inside else list(range(N // 2 - 1, -1, -1))
    group = col.new_group(mine, members_only=True)
    made = bool(group) and group.ranks == tuple(mine) and group.rank() == mine.index(RANK)
    result = group.allreduce(x)
    group.destroy()
    agree(made, "the groups' ranks")
    agree(np.array_equal(result, expected), "allreduce on a group made by its members, and beside it")
    agree(np.all(col.allreduce(np.ones(2)) == N), "the world still in step")


@pytest.mark.skipif(N < 2, reason="needs two members to list each other")
def test_members_that_list_each_other_in_other_orders_all_raise_at_once():
    """Issue 36, item 2: MPI's Comm_create_group made two different groups of [0, 1] and [1, 0]
    without a word, and the first call on them hung for the whole timeout. Now the members tell
    each other their lists first; the other ranks go on meanwhile."""
    if RANK < 2:
        ranks = [0, 1] if RANK == 0 else [1, 0]
        try:
            col.new_group(ranks, members_only=True, timeout=60)
        except col.CollectiveUsageError as e:
            ok, text = "new_group: ranks: members differs across ranks: rank 0: (0, 1), rank 1: (1, 0)" == str(e), str(e)
        else:
            ok, text = False, "no error"
        agree(ok, f"rank {RANK}: {text}")
    else:
        agree(True, "")
    agree(np.all(col.allreduce(np.ones(2)) == N), "the world still in step")


@pytest.mark.skipif(N < 2, reason="needs another rank to name")
def test_a_non_member_making_a_members_only_group_is_told_so():
    other = (RANK + 1) % N
    with pytest.raises(col.CollectiveUsageError, match=rf"rank {RANK} is not one of \[{other}\]$"):
        col.new_group([other], members_only=True)
