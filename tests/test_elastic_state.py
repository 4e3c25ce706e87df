"""Tier 1: col.elastic.State in one process, without MPI: a commit is a copy kept on this rank, restore
puts it back (arrays in place, so views held elsewhere stay valid), and what sync could not send
as it is (JSON gives back a tuple as a list, an int key as a string; an object array not at all)
is refused when it is set, naming the item."""
import numpy as np
import pytest

from collectives.elastic import State
from collectives.errors import CollectiveUsageError

pytestmark = pytest.mark.quick


def test_restore_puts_the_last_commit_back_arrays_in_place_values_by_value():
    weights = np.arange(4.0)
    view = weights[1:3]
    state = State(weights=weights, step=0, history=[{"loss": 1.0}])
    state.weights += 1
    state.step, state.history = 1, state.history + [{"loss": 0.5}]
    state.commit()
    state.weights *= 100
    state.step = 2
    state.history.append({"loss": 0.1})   # (changed in place: the commit holds a copy)
    state.restore()
    assert state.weights is weights and view.tolist() == [2.0, 3.0]
    assert state.weights.tolist() == [1.0, 2.0, 3.0, 4.0] and state.step == 1
    assert state.history == [{"loss": 1.0}, {"loss": 0.5}] and state.commits == 1


def test_an_array_replaced_by_another_shape_is_restored_as_the_committed_copy():
    state = State(weights=np.zeros(3))
    state.commit()
    state.weights = np.ones(5)
    state.restore()
    assert state.weights.tolist() == [0.0, 0.0, 0.0]


def test_a_torch_tensor_is_restored_in_place():
    torch = pytest.importorskip("torch")
    tensor = torch.zeros(3)
    state = State(params=tensor)
    tensor += 1
    state.commit()
    tensor += 1
    state.restore()
    assert state.params is tensor and tensor.tolist() == [1.0, 1.0, 1.0]


def test_a_tensor_off_the_cpu_is_refused_naming_its_device():
    torch = pytest.importorskip("torch")
    with pytest.raises(CollectiveUsageError, match=r"elastic\.State: params: a tensor on meta \(State holds CPU"):
        State(params=torch.zeros(3, device="meta"))


@pytest.mark.parametrize("value, says", [
    (np.array([object()]), "dtype object"),
    ((1, 2), "tuple (1, 2) (it would come back as a list"),
    ({1: "a"}, "key that is not a string (1: it would come back as '1')"),
    ([1, {"a": (2,)}], "tuple (2,)"),
    (np.int64(3), "int64"),
    ({1, 2}, "set"),
])
def test_what_sync_could_not_send_as_it_is_is_refused_naming_the_item(value, says):
    with pytest.raises(CollectiveUsageError, match=r"elastic\.State: item: ") as raised:
        State(item=value)
    assert says in str(raised.value)
    state = State(item=0)
    with pytest.raises(CollectiveUsageError, match=r"elastic\.State: item: "):
        state.item = value
    assert state.item == 0


def test_plain_values_pass_numpy_floats_and_nan_too():
    state = State(a=[1, 2.5, None, True, "s", {"k": [1]}], b=np.float64(0.25), c=float("nan"))
    assert state.b == 0.25 and state.c != state.c


def test_an_unknown_item_is_an_error_naming_the_items():
    state = State(step=0)
    with pytest.raises(AttributeError, match="'epoch' is not one of its items \\(step\\)"):
        state.epoch = 1
    with pytest.raises(AttributeError, match="State has no 'epoch' \\(it holds step\\)"):
        state.epoch


def test_a_bfloat16_tensor_is_committed_and_restored_in_place_bit_for_bit():
    torch = pytest.importorskip("torch")
    tensor = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    state = State(params=tensor)
    tensor *= 2
    state.restore()
    assert state.params is tensor and tensor.tolist() == [1.5, -2.25, 3.0]


def test_restore_gives_back_the_kind_that_was_committed_and_replaces_a_read_only_array():
    torch = pytest.importorskip("torch")
    state = State(weights=torch.ones(3))
    state.weights = np.zeros(3, np.float32)   # (same shape and dtype, another kind)
    state.restore()
    assert isinstance(state.weights, torch.Tensor) and state.weights.tolist() == [1.0] * 3
    frozen = np.zeros(3, np.float32)
    frozen.flags.writeable = False
    state.weights = frozen
    state.restore()
    assert isinstance(state.weights, torch.Tensor) and frozen.tolist() == [0.0] * 3


@pytest.mark.parametrize("make, says", [
    (lambda torch: torch.zeros(3).to_sparse(), "a torch.sparse_coo tensor"),
    (lambda torch: torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.qint8), "a quantized tensor"),
    (lambda torch: torch.zeros(3, dtype=torch.complex64).conj(), "a tensor with its conjugate or negative bit"),
])
def test_a_tensor_whose_memory_state_cannot_copy_is_refused_naming_it(make, says):
    torch = pytest.importorskip("torch")
    with pytest.raises(CollectiveUsageError, match=f"elastic\\.State: params: {says}"):
        State(params=make(torch))


@pytest.mark.parametrize("name", ["commit", "commits", "restore", "_items"])
def test_an_item_named_like_states_own_attributes_is_refused(name):
    with pytest.raises(CollectiveUsageError, match=f"elastic\\.State: {name}: a name State keeps for itself"):
        State(**{name: 1})
