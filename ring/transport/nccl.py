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
little metadata (the NCCL unique id at start, the cross-rank check) and holds
the deadline, which bounds every wait on the host.
"""
from __future__ import annotations

import os
from typing import Any

from ring import arrays
from ring.schedule import left, right
from ring.transport.base import OverHost, Transport, TransportError

_UNIQUE_ID_BYTES = 128
MULTI_RANK_GPU_VERSION = 23000   # NCCL 2.30: first to accept several ranks on one GPU (when enabled)


def _cupy():
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as e:
        raise TransportError(f"the GPU path needs CuPy with NCCL ({e}); install the extra that matches "
                             'your CUDA: pip install -e ".[cuda12]" or ".[cuda13]"') from e
    return cupy, nccl


def _device_count() -> int:
    cupy, _ = _cupy()
    try:
        return cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as e:
        raise TransportError(f"no usable CUDA device: {e}") from e


def use_device(device: int) -> None:
    """Make GPU ``device`` current for this process (NCCL binds a communicator to the current GPU)."""
    cupy, _ = _cupy()
    count = _device_count()
    if not 0 <= device < count:
        raise TransportError(f"GPU {device} is not visible ({count} visible; check CUDA_VISIBLE_DEVICES)")
    cupy.cuda.Device(device).use()


def use_local_device(local_rank: int) -> int:
    """One GPU per rank: make GPU ``local_rank % visible GPUs`` current; return its index."""
    count = _device_count()
    if count == 0:
        raise TransportError("no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)")
    use_device(local_rank % count)
    return local_rank % count


def usable(local_size: int) -> tuple[bool, str]:
    """Whether NCCL can carry this host's ranks, and if not, why (for the automatic choice)."""
    try:
        _, nccl = _cupy()
    except TransportError as e:
        return False, str(e)
    if not getattr(nccl, "available", True):
        return False, "CuPy was built without NCCL"
    gpus = _device_count()
    if local_size > gpus:
        version = nccl.get_version()
        if version < MULTI_RANK_GPU_VERSION or os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") != "1":
            return False, (f"{local_size} ranks share {gpus} GPU(s): NCCL "
                           f"{version} needs >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1 for that")
    return True, ""


def connect(host: Transport) -> "NCCLTransport":
    """Make the NCCL communicator of ``host``'s ranks: rank 0's unique id travels over ``host``."""
    _, nccl = _cupy()
    unique_id = nccl.get_unique_id() if host.rank == 0 else b""
    raw = unique_id if isinstance(unique_id, bytes) else bytes(v % 256 for v in unique_id)
    raw = host.allgather_bytes(raw.ljust(_UNIQUE_ID_BYTES, b"\0"))[0]
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

    def send_to_right(self, buf: Any) -> bool:
        self._noted.append((True, buf, self._right))
        return True

    def recv_from_left(self, buf: Any) -> bool:
        self._noted.append((False, buf, self._left))
        return True

    def wait(self, request: Any) -> None:
        if self._noted:
            self._post()

    def exchange(self, send: Any | None, recv: Any | None, dest: int | None = None,
                 source: int | None = None, reuse: bool = False) -> None:
        if recv is not None:
            self._noted.append((False, recv, self._left if source is None else source))
        if send is not None:
            self._noted.append((True, send, self._right if dest is None else dest))
        self._post()

    def _post(self) -> None:
        cupy, nccl = _cupy()
        stream = cupy.cuda.get_current_stream().ptr
        noted, self._noted = self._noted, []
        try:
            nccl.groupStart()
            try:
                for is_send, buf, peer in noted:
                    post = self.comm.send if is_send else self.comm.recv
                    post(arrays.address(buf), buf.nbytes, nccl.NCCL_INT8, peer, stream)
            finally:
                nccl.groupEnd()
        except nccl.NcclError as e:
            raise TransportError(f"NCCL point-to-point with ranks {sorted({p for _, _, p in noted})} failed: {e}") from e


    def close(self, failed: bool = False) -> None:
        """Destroy the communicator at exit; after a failure abort it instead (a peer may never come)."""
        if failed:
            self.comm.abort()
        else:
            self.comm.destroy()
