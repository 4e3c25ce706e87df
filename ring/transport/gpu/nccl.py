"""Point-to-point over NCCL (through CuPy), on device memory, on the current CuPy stream.

Each step's sends and receives are posted together in one NCCL group: two ranks
that each post a send before their receive would otherwise wait for each other
forever. ``send_to_right`` and ``recv_from_left`` therefore only note the
transfer; the next ``wait`` (or an ``exchange``) posts everything noted so far
as one group.

Nothing here blocks the host. Completion is stream order: the CuPy kernel that
reduces a received segment is queued after the receive on the same stream, so
it runs once the bytes have landed; the result of a collective is ready on the
current stream when the call returns. The MPI ("host") transport carries the
little metadata (the NCCL unique id at start, the cross-rank check); the call's
bound limits every wait on the host. The queued work, which the host does not
wait for, is bounded by the same call's deadline: a watchdog
(``ring.transport.gpu.watchdog``) aborts the communicator if it is still unfinished
after it, instead of leaving a later stream synchronization waiting forever.
"""
from __future__ import annotations

import sys
import threading
from typing import Any

from ring import arrays
from ring.schedule import left, right
from ring.transport.base import Bound, OverHost, Transport, TransportError
from ring.transport.gpu.watchdog import Watchdog

_UNIQUE_ID_BYTES = 128
#: How long a process waits at its end for NCCL's teardown of the communicator. NCCL may wait there
#: for the other ranks on the node (destroy, and since 2.16 abort too: they share memory), which a
#: failed job cannot promise (a rank dead, or stuck in its own code).
TEARDOWN_SECONDS = 10.0


def _cupy():
    try:
        import cupy
    except ImportError as e:
        raise TransportError(f"the GPU path needs CuPy ({e}); install the extra that matches your CUDA: "
                             'pip install -e ".[cuda12]" or ".[cuda13]"') from e
    return cupy


def _nccl():
    """CuPy's NCCL binding; TransportError says what is missing (CuPy itself, or NCCL under it)."""
    _cupy()
    try:
        from cupy.cuda import nccl
    except ImportError as e:
        raise TransportError(f"CuPy cannot load NCCL ({e}); install nvidia-nccl-cu12 or -cu13 to match CuPy") from e
    if not getattr(nccl, "available", True):
        raise TransportError("CuPy was built without NCCL")
    return nccl


def _device_count() -> int:
    cupy = _cupy()
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as e:
        raise TransportError(f"no usable CUDA device: {e}") from e


def use_device(device: int) -> None:
    """Make GPU ``device`` current for this process (NCCL binds a communicator to the current GPU)."""
    count = _device_count()
    if not 0 <= device < count:
        raise TransportError(f"GPU {device} is not visible ({count} visible; check CUDA_VISIBLE_DEVICES)")
    _cupy().cuda.Device(device).use()


def use_local_device(local_rank: int) -> int:
    """One GPU per rank: make GPU ``local_rank % visible GPUs`` current; return its index."""
    count = _device_count()
    if count == 0:
        raise TransportError("no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)")
    use_device(local_rank % count)
    return local_rank % count


def pci_bus_id(device: int) -> str:
    """The physical identity of GPU ``device`` (the same for every process that sees that GPU)."""
    return _cupy().cuda.Device(device).pci_bus_id


def version() -> int:
    """NCCL's version code (23203 for 2.32.3); TransportError if NCCL cannot be used."""
    return _nccl().get_version()


def connect(host: Transport, bound: Bound) -> "NCCLTransport":
    """Make the NCCL communicator of ``host``'s ranks: rank 0's unique id travels over ``host``."""
    nccl = _nccl()
    unique_id = nccl.get_unique_id() if host.rank == 0 else b""
    raw = unique_id if isinstance(unique_id, bytes) else bytes(v % 256 for v in unique_id)
    raw = host.allgather_bytes(raw.ljust(_UNIQUE_ID_BYTES, b"\0"), bound)[0]
    try:
        try:
            comm = nccl.NcclCommunicator(host.size, raw, host.rank)
        except TypeError:   # older CuPy: the id is a tuple of signed chars
            comm = nccl.NcclCommunicator(host.size, tuple(b - 256 if b > 127 else b for b in raw), host.rank)
    except nccl.NcclError as e:
        raise TransportError(f"NCCL communicator of {host.size} ranks could not be made: {e}") from e
    return NCCLTransport(comm, host)


class NCCLTransport(OverHost):
    """The ``Transport`` protocol on device buffers, over an NCCL communicator."""

    def __init__(self, comm: Any, host: Transport):
        super().__init__(host)
        self.comm = comm
        self._right = right(self.rank, self.size)
        self._left = left(self.rank, self.size)
        self._noted: list[tuple[bool, Any, int]] = []   # (is a send, buffer, peer), not yet posted
        self.watchdog = Watchdog(self._expire)

    def send_to_right(self, buf: Any, bound: Bound) -> bool:
        self._noted.append((True, buf, self._right))
        return True

    def recv_from_left(self, buf: Any, bound: Bound) -> bool:
        self._noted.append((False, buf, self._left))
        return True

    def wait(self, request: Any, bound: Bound) -> None:
        if self._noted:
            self._post(bound)

    def exchange(self, send: Any | None, recv: Any | None, bound: Bound, dest: int | None = None,
                 source: int | None = None, reuse: Any = None) -> None:
        if recv is not None:
            self._noted.append((False, recv, self._left if source is None else source))
        if send is not None:
            self._noted.append((True, send, self._right if dest is None else dest))
        self._post(bound)

    def _post(self, bound: Bound) -> None:
        if self.watchdog.expired:
            raise TransportError(f"the NCCL communicator was aborted: {self.watchdog.expired}")
        nccl, cupy = _nccl(), _cupy()
        stream = cupy.cuda.get_current_stream()
        noted, self._noted = self._noted, []
        try:
            nccl.groupStart()
            try:
                for is_send, buf, peer in noted:
                    post = self.comm.send if is_send else self.comm.recv
                    post(arrays.address(buf), buf.nbytes, nccl.NCCL_INT8, peer, stream.ptr)
            finally:
                nccl.groupEnd()
        except nccl.NcclError as e:
            raise TransportError(f"NCCL point-to-point with ranks {sorted({p for _, _, p in noted})} failed: {e}") from e
        done = cupy.cuda.Event(block=False, disable_timing=True)
        done.record(stream)
        self.watchdog.watch(done, bound.until)

    def _expire(self, why: str) -> None:
        """The watchdog's verdict (on its thread): end the stuck kernels, so that nobody waits on them forever."""
        print(f"rank {self.rank}: {why}; aborting the NCCL communicator, so waits on the stream end and "
              "the next collective raises CollectiveError", file=sys.stderr, flush=True)
        self.comm.abort()

    def close(self, failed: bool = False) -> None:
        """Release the communicator at exit: destroy it where every rank of the job ended well,
        abort it otherwise (``failed``: the caller tells every rank alike, since NCCL's teardown
        pairs across ranks). On a thread of its own, for at most TEARDOWN_SECONDS: past that this
        process goes on to its end, which frees what the communicator held on the GPU anyway."""
        self.watchdog.stop()
        if self.watchdog.expired:
            return   # already aborted
        release = self.comm.abort if failed else self.comm.destroy
        teardown = threading.Thread(target=release, name="NCCL teardown", daemon=True)
        teardown.start()
        teardown.join(TEARDOWN_SECONDS)
        if teardown.is_alive():
            print(f"rank {self.rank}: NCCL's {'abort' if failed else 'destroy'} of the communicator did not end in "
                  f"{TEARDOWN_SECONDS:g} s (a rank gone, or stuck?); this process ends without it",
                  file=sys.stderr, flush=True)
