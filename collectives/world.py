"""The process's one world: MPI started lazily, a private communicator, the settings.

Settings (keyword arguments of :func:`init`, or environment variables; each must be
the same on every rank):

``COLLECTIVES_SEGMENT_BYTES`` / ``segment_bytes``
    Largest message the ring sends, default 4 MiB. Bounds the receive scratch to two
    segments and sets how finely reduction overlaps transfer.
``COLLECTIVES_SMALL_BYTES`` / ``small_bytes``
    All-reduces (and reduce-scatters) of at most this many bytes take the latency path,
    recursive doubling, instead of the ring. Default 32 KiB, at most 64 KiB; 0 turns it off.
``COLLECTIVES_CHECK`` / ``check``
    1 (default): before data moves, every rank checks that all ranks make the same call
    (see ``collectives.call``). 0: skip that check on the ring path to save its round trip.
``COLLECTIVES_TIMEOUT`` / ``timeout``
    Seconds a collective may wait for the other ranks before raising CollectiveError,
    default 600. Each collective also takes ``timeout=`` for one call.
``COLLECTIVES_GPU_TRANSPORT`` / ``gpu_transport``
    How cupy arrays move: "nccl", "staged" (through host memory, over MPI) or "auto"
    (default): NCCL where it can carry every rank, else staged (see
    ``ring.transport.device``). The transport is made by ``use_local_gpu()`` (GPU
    ``local_rank() % visible GPUs``), or else by the first collective on a cupy
    array, for the GPU that array is on: one GPU per rank.
"""
from __future__ import annotations

import atexit
import os

import numpy as np

from collectives.errors import CollectiveError, CollectiveUsageError
from ring.doubling import MAX_PAYLOAD_BYTES
from ring.transport import device as device_transports
from ring.transport.base import Transport

DEFAULT_SEGMENT_BYTES = 4 << 20
DEFAULT_SMALL_BYTES = 32 << 10
DEFAULT_TIMEOUT = 600.0


class World:
    """Rank, size, the ring's transport and the settings, shared by every collective."""

    def __init__(self, transport, segment_bytes: int, small_bytes: int, check: bool, timeout: float,
                 gpu_transport: str = "auto"):
        self.transport = transport
        self.gpu_transport = gpu_transport
        self.device_transport = None   # made by the first collective on a cupy array (see transport_for)
        self.rank = transport.rank
        self.size = transport.size
        self.segment_bytes = segment_bytes
        self.small_bytes = small_bytes
        self.check = check
        self.timeout = timeout
        self.seq = 0                       # collectives called so far, the same on every rank in step
        self.failure: str | None = None    # set once a transport failure left the ranks out of step

    def segment_elems(self, dtype: np.dtype) -> int:
        return max(1, self.segment_bytes // dtype.itemsize)

    def transport_for(self, x) -> Transport:
        """The transport that carries ``x``: MPI for numpy arrays; for cupy arrays the device
        transport, made on first use (every rank must be in this call: collectives agree first)."""
        if isinstance(x, np.ndarray):
            return self.transport
        self.open_device_transport(x.device.id)
        return self.device_transport

    def open_device_transport(self, device: int | None) -> int:
        """Make the transport for cupy arrays on GPU ``device`` (None: GPU ``local_rank %
        visible GPUs``), made current, unless it exists (then ``device`` must be its GPU); return
        the GPU's index. Every rank must make it together, as the first collective on a cupy
        array does (see ``ring.transport.device``)."""
        if self.device_transport is None:
            try:
                self.device_transport = device_transports.open_transport(self.transport, device,
                                                                         self.gpu_transport)
            except device_transports.Unavailable as e:   # the same on every rank: still in step
                setting = " (COLLECTIVES_GPU_TRANSPORT=nccl)" if self.gpu_transport == "nccl" else ""
                raise CollectiveError(f"{e}{setting}") from e
        elif device is not None and device != self.device_transport.gpu:
            raise CollectiveError(f"rank {self.rank}: an array on GPU {device}, but this rank's "
                                  f"collectives run on GPU {self.device_transport.gpu} (one GPU per rank)")
        return self.device_transport.gpu


_world: World | None = None


def _setting(name: str, given, env: str, default, parse, ok, expected: str):
    """A setting from its keyword argument, else its environment variable, else the default."""
    if given is not None:
        if isinstance(given, bool) is not (parse is _flag) or not ok(given):
            raise CollectiveUsageError(f"init: {name}: expected {expected}, got {given!r}")
        return given
    raw = os.environ.get(env)
    if raw is None:
        return default
    try:
        value = parse(raw)
    except (ValueError, KeyError):
        value = None
    if value is None or not ok(value):
        raise CollectiveUsageError(f"init: {env}: expected {expected}, got {raw!r}")
    return value


def _flag(raw: str) -> bool:
    return {"0": False, "1": True}[raw.strip()]


def init(segment_bytes: int | None = None, *, small_bytes: int | None = None, check: bool | None = None,
         timeout: float | None = None, gpu_transport: str | None = None) -> None:
    """Start MPI (if needed) and this runtime; idempotent, and done lazily by the first collective.

    Arguments override the environment variables of the module docstring; on a second
    call, the ones given replace the current settings.

    >>> import collectives as col
    >>> col.init(); col.init(timeout=60)          # the second call only sets the timeout
    >>> 0 <= col.rank() < col.size()
    True
    """
    global _world
    settings = dict(
        segment_bytes=_setting("segment_bytes", segment_bytes, "COLLECTIVES_SEGMENT_BYTES", DEFAULT_SEGMENT_BYTES,
                               int, lambda v: isinstance(v, int) and v >= 1, "a positive byte count"),
        small_bytes=_setting("small_bytes", small_bytes, "COLLECTIVES_SMALL_BYTES", DEFAULT_SMALL_BYTES, int,
                             lambda v: isinstance(v, int) and 0 <= v <= MAX_PAYLOAD_BYTES,
                             f"a byte count from 0 to {MAX_PAYLOAD_BYTES}"),
        check=_setting("check", check, "COLLECTIVES_CHECK", True, _flag, lambda v: isinstance(v, bool),
                       "True/False (environment: 1 or 0)"),
        timeout=_setting("timeout", timeout, "COLLECTIVES_TIMEOUT", DEFAULT_TIMEOUT, float,
                         lambda v: isinstance(v, (int, float)) and v > 0, "a positive number of seconds"),
        gpu_transport=_setting("gpu_transport", gpu_transport, "COLLECTIVES_GPU_TRANSPORT", "auto", str,
                               lambda v: v in device_transports.CHOICES,
                               " or ".join(map(repr, device_transports.CHOICES))),
    )
    if _world is not None:
        given = dict(segment_bytes=segment_bytes, small_bytes=small_bytes, check=check, timeout=timeout,
                     gpu_transport=gpu_transport)
        for name, value in given.items():
            if value is not None:
                setattr(_world, name, settings[name])
        return
    from mpi4py import MPI   # starts MPI on first import: only when asked for

    from ring.transport.mpi import MPITransport
    comm = MPI.COMM_WORLD.Dup()   # our messages never match the user's
    atexit.register(_free, comm)   # runs before mpi4py's own finalize (registered earlier)
    _world = World(MPITransport(comm), **settings)


def _free(comm) -> None:
    global _world
    device, failed = (_world.device_transport, _world.failure is not None) if _world else (None, False)
    _world = None
    if hasattr(device, "close"):
        device.close(failed)
    try:
        comm.Free()
    except Exception:
        pass


def world() -> World:
    if _world is None:
        init()
    return _world


def local_rank() -> int:
    """This process's rank among the ranks on its host: pick its GPU with it.

    >>> cupy.cuda.Device(col.local_rank() % cupy.cuda.runtime.getDeviceCount()).use()  # doctest: +SKIP
    """
    return world().transport.local_rank


def local_size() -> int:
    """How many ranks run on this host."""
    return world().transport.local_size


def rank() -> int:
    """This process's rank in the world, 0..size()-1."""
    return world().rank


def size() -> int:
    """The number of ranks in the world."""
    return world().size
