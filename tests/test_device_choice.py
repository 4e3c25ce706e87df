"""Tier 1: which transport carries cupy arrays, from every rank's findings (no GPU needed).

The verdict is pure (``device.choose``); the probe is checked against a stand-in for
the few CuPy calls it makes, and the agreement runs over the simulated world, where
every rank must reach the same verdict.
"""
import types

import pytest

from ring.transport.base import TransportError
from ring.transport.base import unbounded
from ring.transport.gpu import device, nccl
from tests.support.simulated import simulate


BOUND = unbounded()   # (the simulated world has its own timeout)

GPU_A, GPU_B = "host1/0000:1b:00.0", "host1/0000:3d:00.0"
NCCL_2_23 = 22304
NCCL_2_32 = 23203


def on(gpu, version=NCCL_2_23, may_share=False, nccl_problem=""):
    return device.Finding(gpu=gpu, nccl_version=version, may_share_gpu=may_share, nccl_problem=nccl_problem)


@pytest.mark.parametrize("wanted", ["auto", "nccl"])
def test_a_gpu_per_rank_goes_over_nccl(wanted):
    assert device.choose([on(GPU_A), on(GPU_B)], wanted) == ("nccl", "")


def test_the_same_device_index_on_different_gpus_is_not_sharing():
    # a scheduler that shows each rank only its own GPU: every rank sees "GPU 0"; bus ids differ
    findings = [on(f"host1/0000:{bus:02x}:00.0") for bus in (0x1b, 0x3d, 0x5e, 0x86)]
    assert device.choose(findings, "auto") == ("nccl", "")


def test_the_same_bus_id_on_another_host_is_not_sharing():
    assert device.choose([on("host1/0000:1b:00.0"), on("host2/0000:1b:00.0")], "auto") == ("nccl", "")


def test_ranks_sharing_a_gpu_are_staged_unless_nccl_may_share_it():
    findings = [on(GPU_A), on(GPU_B), on(GPU_A)]
    kind, why = device.choose(findings, "auto")
    assert kind == "staged"
    assert "ranks 0, 2 share GPU host1/0000:1b:00.0" in why and "NCCL 2.23.4" in why and "2.30" in why
    with pytest.raises(device.Unavailable, match="NCCL cannot carry these ranks: ranks 0, 2 share GPU"):
        device.choose(findings, "nccl")
    shared = [on(GPU_A, NCCL_2_32, may_share=True)] * 3
    assert device.choose(shared, "auto") == ("nccl", "")
    one_not_enabled = [on(GPU_A, NCCL_2_32, may_share=True), on(GPU_A, NCCL_2_32, may_share=False)]
    assert device.choose(one_not_enabled, "auto")[0] == "staged"


def test_a_rank_without_nccl_stages_every_rank():
    findings = [on(GPU_A), on(GPU_B, version=0, nccl_problem="CuPy was built without NCCL")]
    assert device.choose(findings, "auto") == ("staged", "rank 1: CuPy was built without NCCL")
    with pytest.raises(device.Unavailable, match="rank 1: CuPy was built without NCCL"):
        device.choose(findings, "nccl")


@pytest.mark.parametrize("wanted", ["auto", "nccl", "staged"])
def test_a_rank_without_a_gpu_is_an_error_whatever_is_wanted(wanted):
    findings = [on(GPU_A), on(GPU_B), device.Finding(problem="no usable CUDA device: driver missing")]
    with pytest.raises(device.Unavailable, match="not available on rank 2: no usable CUDA device: driver missing"):
        device.choose(findings, wanted)


def test_staged_when_asked_for():
    assert device.choose([on(GPU_A), on(GPU_B)], "staged") == ("staged", "")


def test_unknown_choice():
    with pytest.raises(ValueError, match="wanted"):
        device.choose([on(GPU_A)], "gloo")


def test_findings_travel_in_fixed_length_whatever_their_text():
    findings = [on(GPU_A, NCCL_2_32, may_share=True), device.Finding(problem="x" * 5000 + "\n tail"),
                device.Finding(gpu="héte/0000:1b:00.0", nccl_problem="é" * 2000),
                device.Finding(problem='"\\' * 400, nccl_problem="\x01" * 400, gpu="\\" * 400)]
    for finding in findings:
        raw = finding.encode()
        assert len(raw) == len(on(GPU_A).encode())
        back = device.Finding.decode(raw)
        assert (back.nccl_version, back.may_share_gpu) == (finding.nccl_version, finding.may_share_gpu)
        for text, sent in zip((back.problem, back.gpu, back.nccl_problem),
                              (finding.problem, finding.gpu, finding.nccl_problem)):
            printable = " ".join("".join(c if c.isprintable() else " " for c in sent).split())
            assert printable.startswith(text) and len(text.encode()) <= 300 and len(text) >= min(len(printable), 100)


@pytest.fixture
def gpus(monkeypatch):
    """Stand-ins for the CuPy calls ``probe`` makes: ``count`` GPUs, bus ids by index."""
    state = {"current": None, "count": 2, "version": NCCL_2_32}

    def use_device(d):
        if not 0 <= d < state["count"]:
            raise TransportError(f"GPU {d} is not visible ({state['count']} visible)")
        state["current"] = d

    def version():
        if state["version"] is None:
            raise TransportError("CuPy cannot load NCCL")
        return state["version"]

    monkeypatch.setattr(nccl, "use_device", use_device)
    monkeypatch.setattr(nccl, "use_local_device", lambda r: use_device(r % state["count"]) or r % state["count"])
    monkeypatch.setattr(nccl, "pci_bus_id", lambda d: f"0000:{0x1b + d:02x}:00.0")
    monkeypatch.setattr(nccl, "version", version)
    monkeypatch.delenv("NCCL_MULTI_RANK_GPU_ENABLE", raising=False)
    return state


def test_probe_picks_the_local_gpu_and_reports_it(gpus, monkeypatch):
    monkeypatch.setattr(device.socket, "gethostname", lambda: "h")
    finding = device.probe(None, local_rank=3)
    assert gpus["current"] == 1
    assert finding == device.Finding(gpu="h/0000:1c:00.0", nccl_version=NCCL_2_32, may_share_gpu=False)
    assert device.probe(0, local_rank=3).gpu == "h/0000:1b:00.0" and gpus["current"] == 0


def test_probe_may_share_a_gpu_only_with_nccl_2_30_and_the_switch_on(gpus, monkeypatch):
    monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1")
    assert device.probe(0, 0).may_share_gpu
    gpus["version"] = 22907
    assert not device.probe(0, 0).may_share_gpu
    gpus["version"] = NCCL_2_32
    monkeypatch.setenv("NCCL_MULTI_RANK_GPU_ENABLE", "0")
    assert not device.probe(0, 0).may_share_gpu


def test_probe_reports_what_is_missing(gpus, monkeypatch):
    assert "GPU 5 is not visible" in device.probe(5, 0).problem
    monkeypatch.setattr(nccl, "pci_bus_id", lambda d: (_ for _ in ()).throw(RuntimeError("cudaErrorUnknown")))
    assert device.probe(0, 0).problem == "cudaErrorUnknown"   # any error is reported, never raised alone
    monkeypatch.setattr(nccl, "pci_bus_id", lambda d: "0000:1b:00.0")
    gpus["version"] = None
    finding = device.probe(0, 0)
    assert not finding.problem and finding.nccl_problem == "CuPy cannot load NCCL" and finding.gpu


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_rank_reaches_the_same_verdict(monkeypatch, n):
    # ranks 0 and 2 share a GPU; the last rank has no GPU in the second round
    def fake_probe(dev, local_rank):
        return on(GPU_A if local_rank in (0, 2) else f"host1/0000:{0x40 + local_rank:02x}:00.0")
    monkeypatch.setattr(device, "probe", fake_probe)
    verdicts = simulate(n, lambda host: device.agree(host, None, "auto", BOUND))
    assert verdicts == [("staged" if n >= 3 else "nccl", verdicts[0][1])] * n

    def without_gpu_on_the_last(dev, local_rank):
        return device.Finding(problem="no usable CUDA device") if local_rank == n - 1 else on(GPU_B)
    monkeypatch.setattr(device, "probe", without_gpu_on_the_last)

    def each(host):
        try:
            device.agree(host, None, "auto", BOUND)
        except device.Unavailable as e:
            return str(e)
    assert simulate(n, each) == [f"the GPU path is not available on rank {n - 1}: no usable CUDA device"] * n


def test_a_rank_keeps_one_gpu_once_its_device_transport_exists():
    from collectives.errors import CollectiveError
    from collectives.groups.group import Group
    from collectives.calls.runtime import Runtime
    from collectives.calls.config import defaults
    from ring.transport.inprocess import InProcessWorld
    runtime = Runtime(defaults(segment_bytes=1024, small_bytes=0, timeout=5.0))
    w = Group(runtime, InProcessWorld(1).transport(0), (0,), world=True)
    made = w.transports.device = device.StagedTransport(w.transport)
    made.gpu = 0
    on_gpu = lambda index: types.SimpleNamespace(device=types.SimpleNamespace(id=index))  # noqa: E731
    assert w.transports.for_array(on_gpu(0), BOUND, "auto") is made is w.device_transport
    assert w.transports.open_device(None, BOUND, "auto") == 0
    with pytest.raises(CollectiveError, match="rank 0: an array on GPU 1, but this rank's collectives run on GPU 0"):
        w.transports.for_array(on_gpu(1), BOUND, "auto")
