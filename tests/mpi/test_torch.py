"""Tier 2: the torch.distributed backend "ring" against torch's own gloo, in one MPI world.

The default process group is gloo (over loopback, port chosen by rank 0); "ring" is a second
group over the same ranks, so every call runs on both and the results are compared. Inputs are
rank-dependent and integer-valued, so every dtype's result is exact and must be equal. Skipped
cleanly where torch is not installed (the extra ``[torch]``).
"""
import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
import collectives  # noqa: E402
import collectives.torch  # noqa: E402,F401 - registers "ring"
from collectives.torch import rendezvous  # noqa: E402
from datetime import timedelta  # noqa: E402

from tests.support.in_world import agree  # noqa: E402
from tests.worlds import free_port

pytestmark = pytest.mark.mpi

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module")
def groups():
    """(ring, gloo): two torch process groups over every rank."""
    port = COMM.bcast(free_port() if RANK == 0 else None)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=RANK, world_size=N,
                            timeout=timedelta(seconds=60))
    ring = dist.new_group(backend="ring")
    yield ring, dist.group.WORLD
    dist.destroy_process_group()


def values(shape, dtype, rank=RANK, offset=0):
    n = int(np.prod(shape))
    return ((torch.arange(n) * 7 + rank * 13 + offset) % 11 + 1).reshape(shape).to(dtype)


def both(groups, call):
    """``call(group)`` on ring and on gloo; their results."""
    ring, gloo = groups
    return call(ring), call(gloo)


def same(a, b) -> bool:
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["SUM", "MIN", "MAX", "PRODUCT"])
def test_all_reduce_matches_gloo(groups, dtype, op):
    def run(g):
        t = values((3, 5), dtype) if op != "PRODUCT" else (values((3, 5), dtype) % 3 + 1)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=g)
        return t
    agree(same(*both(groups, run)), f"all_reduce {op} {dtype}")


def test_all_reduce_avg_is_the_sum_over_n(groups):
    ring, gloo = groups
    t, s = values((7,), torch.float32), values((7,), torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.AVG, group=ring)
    dist.all_reduce(s, group=gloo)
    agree(torch.equal(t, s / N), "all_reduce AVG")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_data_movement_matches_gloo(groups, dtype):
    root = N - 1

    def run(g):
        got = {}
        b = values((4, 3), dtype)
        dist.broadcast(b, src=root, group=g)
        got["broadcast"] = b
        parts = [torch.zeros(2, 3, dtype=dtype) for _ in range(N)]
        dist.all_gather(parts, values((2, 3), dtype), group=g)
        got["all_gather"] = parts
        whole = torch.zeros(N * 2, 3, dtype=dtype)
        dist.all_gather_into_tensor(whole, values((2, 3), dtype), group=g)
        got["all_gather_into_tensor"] = whole
        outs = [torch.zeros(3, dtype=dtype) for _ in range(N)]
        dist.all_to_all(outs, [values((3,), dtype, offset=j) for j in range(N)], group=g)
        got["all_to_all"] = outs
        single = torch.zeros(N * 2, dtype=dtype)
        dist.all_to_all_single(single, values((N * 2,), dtype), group=g)
        got["all_to_all_single"] = single
        gathered = [torch.zeros(5, dtype=dtype) for _ in range(N)] if RANK == root else None
        dist.gather(values((5,), dtype), gathered, dst=root, group=g)
        got["gather"] = gathered or []
        mine = torch.zeros(4, dtype=dtype)
        dist.scatter(mine, [values((4,), dtype, offset=j) for j in range(N)] if RANK == root else None, src=root,
                     group=g)
        got["scatter"] = mine
        r = values((6,), dtype)
        dist.reduce(r, dst=root, group=g)
        got["reduce"] = r if RANK == root else torch.zeros(0)
        return got

    ring, gloo = both(groups, run)
    for name in ring:
        agree(same(ring[name], gloo[name]), f"{name} {dtype}")


def test_uneven_all_to_all_single_and_reduce_scatter_match_a_reference(groups):
    ring, _ = groups
    send = [(RANK + j) % 3 for j in range(N)]
    receive = [(i + RANK) % 3 for i in range(N)]
    x = values((sum(send), 2), torch.float64)
    out = torch.zeros(sum(receive), 2, dtype=torch.float64)
    dist.all_to_all_single(out, x, output_split_sizes=receive, input_split_sizes=send, group=ring)
    everyone = COMM.allgather(x.numpy())
    pieces = [np.split(everyone[i], np.cumsum([(i + j) % 3 for j in range(N)])[:-1])[RANK] for i in range(N)]
    agree(np.array_equal(out.numpy(), np.concatenate(pieces)), "uneven all_to_all_single")
    inputs = [values((3,), torch.float32, offset=j) for j in range(N)]
    mine = torch.zeros(3)
    dist.reduce_scatter(mine, inputs, group=ring)
    expected = sum(values((3,), torch.float32, rank=r, offset=RANK) for r in range(N))   # every rank's block for me
    whole = torch.zeros(3)
    dist.reduce_scatter_tensor(whole, torch.cat(inputs), group=ring)
    agree(torch.equal(mine, expected) and torch.equal(whole, expected), "reduce_scatter")


@pytest.mark.parametrize("op", ["SUM", "MAX", "MIN"])
def test_a_reduce_scatter_of_an_uneven_list_matches_gloo(groups, op):
    """Rank j's output has tensor j's size (gloo computes it); MAX and MIN of negative and positive
    values show the padding never reaches a kept element."""
    sizes = [1 + (j * 3) % 5 for j in range(N)]
    inputs = [values((sizes[j],), torch.float32, offset=j) - 6 for j in range(N)]

    def run(group):
        mine = torch.zeros(sizes[RANK])
        dist.reduce_scatter(mine, [t.clone() for t in inputs], op=getattr(dist.ReduceOp, op), group=group)
        return mine
    ring, gloo = both(groups, run)
    agree(same(ring, gloo), f"uneven reduce_scatter {op}: ring {ring.tolist()} gloo {gloo.tolist()}")


def test_a_wait_that_runs_out_leaves_the_call_going_and_the_group_usable(groups):
    """As gloo's: ``work.wait(timeout)`` that runs out raises on that rank only; the call goes on,
    a second ``wait()`` returns its result, and the next call works. The last rank comes only once
    rank 0's wait has run out (told over MPI's own world, a cue, not a sleep)."""
    ring, _ = groups
    t = values((100,), torch.float32)
    ran_out = None
    if RANK < N - 1:
        work = dist.all_reduce(t, group=ring, async_op=True)
        if RANK == 0:
            try:
                work.wait(timeout=timedelta(seconds=0.3))
            except dist.DistBackendError as error:
                ran_out = str(error)
            COMM.send(True, dest=N - 1)
        work.wait()
    else:
        if N > 1:
            COMM.recv(source=0)
        dist.all_reduce(t, group=ring)
    expected = sum(values((100,), torch.float32, rank=r) for r in range(N))
    after = torch.ones(3)
    dist.all_reduce(after, group=ring)
    waited_right = RANK != 0 or N == 1 or (ran_out is not None and "wait: timed out after 0.3 s" in ran_out)
    agree(torch.equal(t, expected) and torch.equal(after, torch.full((3,), float(N))) and waited_right,
          f"the call, the next, and rank 0's wait ({ran_out})")


def test_async_work_and_its_future(groups):
    ring, _ = groups
    t = values((1000,), torch.float32)
    work = dist.all_reduce(t, group=ring, async_op=True)
    doubled = work.get_future().then(lambda f: f.value()[0] * 2).wait()
    work.wait()
    expected = sum(values((1000,), torch.float32, rank=r) for r in range(N))
    agree(torch.equal(t, expected) and torch.equal(doubled, expected * 2), "async all_reduce and future")


def test_a_future_callback_may_issue_a_call_and_wait_for_it(groups):
    """PowerSGD's pattern (powerSGD_hook: a ``then`` callback all-reduces P and waits for its
    future, then another does Q): two levels of calls issued and waited inside callbacks, as on
    gloo. Before the fix the callback ran on the runtime's engine thread, which the nested call
    needs: a deadlock, ended here by pytest's timeout."""
    def nested(g):
        t, p, q = (values((50,), torch.float32, offset=k) for k in range(3))

        def then_p(f):
            return f.value()[0] + dist.all_reduce(p, group=g, async_op=True).get_future().wait()[0]

        def then_q(f):
            return f.value() + dist.all_reduce(q, group=g, async_op=True).get_future().wait()[0]
        return dist.all_reduce(t, group=g, async_op=True).get_future().then(then_p).then(then_q).wait()
    agree(same(*both(groups, nested)), "calls issued and waited in future callbacks")


def test_a_callback_issues_the_same_call_whichever_thread_runs_it(groups):
    """On rank 0 the future is done before the callback is attached, so torch runs it at once in
    the main thread; on the others it runs in the thread that completes the future. The calls it
    issues must pair, as on gloo (before, the runtime refused: 'calling thread differs')."""
    ring, _ = groups
    future = dist.all_reduce(values((8,), torch.float32), group=ring, async_op=True).get_future()
    if RANK == 0:
        future.wait()
    nested = future.then(lambda f: dist.all_reduce(f.value()[0] * 2, group=ring, async_op=True).get_future()
                         .wait()[0]).wait()
    expected = sum(values((8,), torch.float32, rank=r) for r in range(N)) * 2 * N
    agree(torch.equal(nested, expected), "a nested call from the main thread and from a future's thread")

def test_a_callbacks_refused_wait_for_a_later_call_leaves_that_call_whole(groups):
    """A then-callback that waits for the work of a call issued after the one it follows is refused
    (that call runs after the callback); the later call then completes, and its work says so at every
    door (before, the refusal became the work's own error: wait, is_success, exception and its future
    all failed, though its tensor held the sum: a tester's case)."""
    ring, _ = groups
    first, later_tensor = values((4,), torch.float32), values((4,), torch.float32, offset=10)
    expected = sum(values((4,), torch.float32, rank=r, offset=10) for r in range(N))
    late = RANK == N - 1   # (it comes once the others have attached their callbacks: their first call then
    if late:               # completes in the engine's thread, whose turn their callbacks hold)
        for peer in range(N - 1):
            COMM.recv(source=peer, tag=61)
    first_work = dist.all_reduce(first, group=ring, async_op=True)
    later = dist.all_reduce(later_tensor, group=ring, async_op=True)
    refused = []

    def waits_for_the_later(f):
        try:
            later.wait()
        except RuntimeError as error:
            refused.append(str(error))
        return f.value()
    chained = first_work.get_future().then(waits_for_the_later)
    if not late:
        COMM.send("attached", dest=N - 1, tag=61)
    chained.wait()
    agree(late or len(refused) == 1 and "wait for it after the callback" in refused[0], f"refused: {refused}")
    agree(later.wait() and later.is_success() and later.exception() is None, "the later work, after the callback")
    agree(torch.equal(later.get_future().wait()[0], expected) and torch.equal(later_tensor, expected),
          "the later call's sum")


def test_a_tensor_the_backend_reduced_can_still_be_resized(groups):
    """batched_powerSGD_hook resizes DDP's bucket buffer (``input_tensor.resize_``) after the
    vanilla all-reduces of its first steps went through it. ``Tensor.numpy()`` marks a storage
    not resizable for good; before the fix every tensor the ring backend had touched raised
    ``Trying to resize storage that is not resizable``, where gloo's stay resizable."""
    def resized(g):
        t = values((6,), torch.float32)
        dist.all_reduce(t, group=g)
        dist.broadcast(t, src=0, group=g)
        t.resize_(9)[6:] = 0
        dist.all_reduce(t, group=g)
        return t.resize_(4).clone()
    agree(same(*both(groups, resized)), "resize_ after the backend's calls")


def test_subgroups_and_point_to_point(groups):
    evens = dist.new_group(list(range(0, N, 2)), backend="ring")
    ok = True
    if RANK % 2 == 0:
        t = torch.tensor([float(RANK)])
        dist.all_reduce(t, group=evens)
        ok = t.item() == sum(range(0, N, 2))
    if N > 1 and RANK < 2:
        ring, _ = groups
        buf = torch.tensor([RANK * 10.0, 1.0])
        if RANK == 0:
            dist.send(buf, dst=1, group=ring)
        else:
            dist.recv(buf, src=0, group=ring)
            ok = ok and buf.tolist() == [0.0, 1.0]
    agree(ok, "subgroup and send/recv")


def test_what_torch_calls_besides_the_collectives(groups):
    """Process-group methods without options (as DDP's communication hooks call them), a subgroup
    destroyed, a receive from any rank that reports its sender, all_gather_coalesced against gloo,
    bool reductions as gloo's, and the process group's monitored_barrier."""
    ring, gloo = groups
    t = values((5,), torch.float32)
    agree(ring.allreduce([t]).wait() and torch.equal(t, sum(values((5,), torch.float32, rank=r) for r in range(N))),
          "allreduce without options")
    evens = dist.new_group(list(range(0, N, 2)), backend="ring")
    dist.destroy_process_group(evens) if RANK % 2 == 0 else None
    ok = True
    if N > 1 and RANK < 2:
        buf = torch.zeros(2)
        if RANK == 1:
            dist.send(torch.tensor([7.0, 8.0]), dst=0, group=ring)
        else:
            ok = dist.recv(buf, group=ring) == 1 and buf.tolist() == [7.0, 8.0]
    agree(ok, "recv from any source")

    def coalesced(g):
        outs = [[torch.zeros(2), torch.zeros(3)] for _ in range(N)]   # (one list per rank)
        dist.all_gather_coalesced(outs, [values((2,), torch.float32), values((3,), torch.float32, offset=1)], group=g)
        return [t for o in outs for t in o]
    agree(same(*both(groups, coalesced)), "all_gather_coalesced")

    def any_and_all(g):
        a, b = torch.tensor([RANK == 0, True]), torch.tensor([RANK == 0, True])
        dist.all_reduce(a, group=g)
        dist.all_reduce(b, op=dist.ReduceOp.PRODUCT, group=g)
        return [a, b]
    agree(same(*both(groups, any_and_all)), "bool all_reduce")
    agree(ring.monitored_barrier() is None, "monitored_barrier")


def test_a_failed_call_reaches_every_door_torch_has(groups):
    """A refusal (the last rank's tensor_list is one too long) through wait(), exception(),
    is_success(), the future and a synchronous call, on every rank; the ranks stay in step, so
    the next call works."""
    ring, _ = groups
    expected = f"all_gather: tensor_list: expected {N} tensors"

    def wrong():
        outs = [torch.zeros(3) for _ in range(N + (RANK == N - 1))]
        return dist.all_gather(outs, torch.ones(3), group=ring, async_op=True)
    work = wrong()
    with pytest.raises(RuntimeError, match=expected) as raised:
        work.wait()
    assert isinstance(raised.value, collectives.CollectiveUsageError)
    assert not work.is_success() and expected in str(work.exception())
    with pytest.raises(RuntimeError, match=expected):
        wrong().get_future().wait()
    with pytest.raises(RuntimeError, match=expected):
        dist.all_gather([torch.zeros(3) for _ in range(N + (RANK == N - 1))], torch.ones(3), group=ring)
    t = torch.ones(2)
    dist.all_reduce(t, group=ring)
    agree(t.tolist() == [N, N], "in step after a refusal")


UNCARRIED = {
    "float8": lambda: torch.ones(3).to(torch.float8_e4m3fn),
    "meta": lambda: torch.ones(3, device="meta"),
    "quantized": lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8),
}


@pytest.mark.parametrize("kind", list(UNCARRIED))
def test_a_tensor_the_backend_cannot_carry_on_one_rank_is_refused_on_every_rank(groups, kind):
    """The last rank's tensor is one the ring cannot move: every rank raises the same error in that
    call (not a local TypeError that leaves the others waiting, to pair with the next call)."""
    ring, _ = groups
    calls = {"all_reduce": lambda t: dist.all_reduce(t, group=ring),
             "broadcast": lambda t: dist.broadcast(t, src=0, group=ring),
             "all_gather": lambda t: dist.all_gather([t.clone() for _ in range(N)], t, group=ring)}
    for name, call in calls.items():
        t = UNCARRIED[kind]() if RANK == N - 1 else torch.ones(3)
        with pytest.raises(RuntimeError, match=f"{name}: .*tensor") as raised:
            call(t)
        assert isinstance(raised.value, collectives.CollectiveUsageError), repr(raised.value)
        if N > 1 and RANK != N - 1:
            assert f"on rank {N - 1}" in str(raised.value), str(raised.value)
        t = torch.full((2,), float(RANK + 1))
        dist.all_reduce(t, group=ring)
        agree(t.tolist() == [N * (N + 1) / 2] * 2, f"in step after refusing a {kind} tensor in {name}")


def test_complex_reductions_match_gloo_and_shared_memory_is_refused_alike(groups):
    ring, _ = groups

    def complex_sums(g):
        z = (values((4,), torch.float32) + 1j * values((4,), torch.float32, offset=3)).to(torch.complex64)
        r = z.clone()
        dist.reduce(r, dst=N - 1, group=g)
        block = torch.zeros(2, dtype=torch.complex64)
        dist.reduce_scatter_tensor(block, torch.cat([z[:2]] * N), group=g)
        return [r if RANK == N - 1 else torch.zeros(0), block]
    agree(same(*both(groups, complex_sums)), "complex reduce and reduce_scatter")

    def sparse_sum(g):
        t = torch.sparse_coo_tensor(torch.tensor([[RANK % 3, 0], [1, RANK % 2]]), torch.tensor([1.0 + RANK, 10.0]),
                                    (3, 2))
        dist.all_reduce(t, group=g)
        return t.to_dense()
    agree(same(*both(groups, sparse_sum)), "sparse all_reduce")
    expanded = torch.ones(1).expand(4) if RANK == 0 else torch.ones(4)
    with pytest.raises(RuntimeError, match=r"all_reduce: tensor: its elements share memory \(an expanded"):
        dist.all_reduce(expanded, group=ring)
    outputs = [torch.zeros(1).expand(4) if RANK == 0 else torch.zeros(4) for _ in range(N)]   # (rank 0's alone)
    with pytest.raises(RuntimeError, match=r"all_gather: tensor_list\[0\]: its elements share memory \(an expanded"):
        dist.all_gather(outputs, torch.ones(4), group=ring)
    lists = [torch.zeros(2) for _ in range(N)]   # (each rank but 0 finds another problem: rank 1's is raised)
    if N > 1:
        with pytest.raises(RuntimeError, match=r"^all_gather: tensor_list: tensor 0 has 2 elements \(shape \(2,\)\); "
                                               r"expected 3, as the input has( \(on rank 1;.*)?$"):
            dist.all_gather(lists, torch.ones(2 + RANK), group=ring)
    store = next(rendezvous.ring_rendezvous("ring://"))[0]   # (the default group here is gloo's: a store of its own)
    for use in (lambda: store.set("k", "v"), lambda: store.num_keys(), lambda: store.add("k", 1)):
        with pytest.raises(RuntimeError, match=r"the ring rendezvous \(ring://, or env:// without MASTER_ADDR "
                                               r".*\) keeps no key-value store"):
            use()
    with pytest.raises(RuntimeError, match="recv: tensor: point-to-point moves contiguous CPU tensors"):
        dist.recv(torch.zeros(4, 2).t(), src=0, group=ring)


def test_unsupported_ops_are_refused_by_name_and_complex_numbers_are_summed(groups):
    ring, _ = groups
    for op in ("BAND", "BOR", "BXOR"):
        with pytest.raises(Exception, match=f"{op} is not supported by the ring backend"):
            dist.all_reduce(torch.ones(2, dtype=torch.int32), op=getattr(dist.ReduceOp, op), group=ring)
    with pytest.raises(Exception, match=r"^all_reduce: op: AVG of a torch.int64 tensor has no result of its dtype"):
        dist.all_reduce(torch.ones(2, dtype=torch.int64), op=dist.ReduceOp.AVG, group=ring)   # (it said "allreduce:")
    z = torch.tensor([1 + 2j, RANK - 1j], dtype=torch.complex64)   # (torch sends complex numbers as pairs of floats)
    dist.all_reduce(z, group=ring)
    agree(z.tolist() == [N * (1 + 2j), sum(range(N)) - N * 1j], "complex all_reduce")


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 3 * 3, 5))


@pytest.mark.parametrize("make, shape", [(mlp, (8, 20)), (cnn, (8, 1, 8, 8))], ids=["mlp", "cnn"])
def test_ddp_trains_like_gloo_with_identical_replicas(groups, make, shape):
    """Unmodified DistributedDataParallel on each group: the same loss at every step, and every
    rank's parameters bit for bit the same at the end."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(g):
        torch.manual_seed(RANK + 1)   # different initial weights: DDP's broadcast from rank 0 must fix them
        model = DDP(make(), process_group=g, bucket_cap_mb=0.001)   # (tiny buckets: several in flight)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        data = torch.Generator().manual_seed(100 + RANK)
        losses = []
        for _ in range(6):
            x = torch.randn(shape, generator=data)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    (ring_losses, ring_params), (gloo_losses, gloo_params) = both(groups, train)
    close = np.allclose(ring_losses, gloo_losses, rtol=1e-6, atol=0)
    replicas = COMM.allgather(ring_params.numpy().tobytes())
    agree(close, f"losses ring {ring_losses} vs gloo {gloo_losses}")
    agree(all(r == replicas[0] for r in replicas), "ring replicas differ")
    agree(torch.allclose(ring_params, gloo_params, rtol=1e-5, atol=1e-7), "ring and gloo models differ")
