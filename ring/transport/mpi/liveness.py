"""Which ranks on other hosts are still there, as their kernels see it: one TCP connection per
pair of ranks on different hosts, that carries nothing but a goodbye.

A process that ends, however it ends (SIGKILL, a crash, the OOM killer, its launcher), has its
sockets closed by its kernel, so the other end reads end-of-file at once: a death on another
host is seen as soon as a death on this host is (by its pid, see ``ring.transport.mpi.transport``). A
rank that leaves the runtime sends one byte first (``goodbye``), so that its end-of-file is not
taken for a death. A host that vanishes (its link down, its power off) sends nothing at all:
TCP keepalive probes, answered by its kernel even while its program computes or sits inside a
long call, find it unreachable after about UNREACHABLE_SECONDS.

For 4 ranks on 2 hosts (ranks 0 and 1 on host a, 2 and 3 on host b), the lower rank of each
pair connects, the higher accepts (lazily, whenever it looks), and the pairs on one host
watch each other's pids instead::

    rank 0: connects to 2, 3        rank 2: accepts 0, 1
    rank 1: connects to 2, 3        rank 3: accepts 0, 1

A rank that cannot connect (a host name that does not resolve to an address its peer listens
on, a firewall) says so once on standard error; deaths there are then seen at the timeout.
"""
from __future__ import annotations

import errno
import fcntl
import os
import select
import socket
import struct
import sys
import termios
import threading
import weakref
from typing import Sequence

#: About how long a host may stay silent before its ranks are called unreachable (keepalive:
#: the first probe after KEEPALIVE_IDLE seconds idle, then KEEPALIVE_PROBES more, one every
#: KEEPALIVE_INTERVAL seconds).
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES = 2, 2, 4
UNREACHABLE_SECONDS = KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_PROBES
GONE, UNREACHABLE = "gone", "unreachable"
_GOODBYE, _PING = b"\x01", b"\x02"
_CONNECT_SECONDS = 5.0
_UNREACHABLE_ERRORS = {errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN}
_alive: "weakref.WeakSet[Liveness]" = weakref.WeakSet()


class Liveness:
    """This rank's watch over the ranks on other hosts (the ranks as the world communicator
    numbers them). Made before the setup's exchange (``port`` travels in it), then ``join``."""

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("", 0))
        self._listener.listen(socket.SOMAXCONN)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self.ended: dict[int, str] = {}        # rank -> GONE or UNREACHABLE (closed without a goodbye)
        self.left: set[int] = set()            # ranks that said goodbye
        self.closed: set[int] = set()          # ranks whose connection has closed, with a goodbye or without
        self._watched: dict[int, socket.socket] = {}   # rank -> its connection
        self._unnamed: list[socket.socket] = []        # accepted, its rank not read yet
        self._poll = select.poll()
        self._by_fd: dict[int, tuple[int | None, socket.socket]] = {}
        self._said_goodbye = False
        self._looking = threading.Lock()   # (a point-to-point wait and the engine's may look at once)
        _alive.add(self)

    def join(self, rank: int, hosts: Sequence[str], ports: Sequence[int]) -> None:
        """Connect to every higher rank on another host (``hosts``, ``ports``: every rank's)."""
        failed = []
        for peer in range(rank + 1, len(hosts)):
            if hosts[peer] == hosts[rank] or ports[peer] <= 0:
                continue
            try:
                connection = socket.create_connection((hosts[peer], ports[peer]), timeout=_CONNECT_SECONDS)
                _keep_alive(connection)
                connection.sendall(rank.to_bytes(4, "little"))
            except OSError as e:
                failed.append(f"rank {peer} on {hosts[peer]}:{ports[peer]} ({e.strerror or e})")
                continue
            self._watch(peer, connection)
        if failed:
            print(f"[rank {rank}] collectives: cannot watch {', '.join(failed)} directly; a death there is "
                  "seen only at the timeout", file=sys.stderr, flush=True)

    def check(self) -> dict[int, str]:
        """Look (without waiting) at every connection; return ``ended``: the ranks whose connection
        closed without a goodbye, each GONE (its process ended) or UNREACHABLE (its host is silent)."""
        if not self._looking.acquire(blocking=False):
            return self.ended   # another thread is looking right now
        try:
            self._look()
        finally:
            self._looking.release()
        return self.ended

    def gone(self, peer: int) -> bool:
        """Whether ``peer``'s process has ended or is ending (its connection closed, after a goodbye
        or without), as its connection says right now (``check`` may return what another thread
        saw last): the guard before every message sent to it. MPICH over UCX, asked to send to a
        peer whose connection its progress engine has already seen close, dereferences a null
        request and the sender dies of SIGSEGV. The ending peer's kernel closes this connection as
        it closes MPI's, so both ends of file arrive together. One select() of one socket: about 1 us."""
        if peer not in self.closed:
            connection = self._watched.get(peer)
            try:
                quiet = connection is not None and not select.select([connection], [], [], 0)[0]
            except (OSError, ValueError):   # closed meanwhile by another thread's look
                quiet = False
            if not quiet:
                with self._looking:
                    self._look()
        return peer in self.closed

    def _look(self) -> None:
        self._accept()
        for fd, _ in self._poll.poll(0):
            if fd in self._by_fd:
                self._read(*self._by_fd[fd])

    def ping(self) -> None:
        """Send every watched rank a byte that it ignores, for ``silent`` to see which hosts' kernels
        acknowledge it (a host's kernel answers even while the rank's program is busy)."""
        for connection in self._watched.values():
            try:
                connection.send(_PING)
            except OSError:
                pass

    def silent(self) -> list[int]:
        """Some time after ``ping``: the watched ranks whose host has not acknowledged it, now
        counted UNREACHABLE (only after a timeout, when the job is failing anyway: a network
        stalled that long is no better than one that is down)."""
        found = []
        for peer, connection in list(self._watched.items()):
            try:
                unacknowledged = struct.unpack("i", fcntl.ioctl(connection.fileno(), termios.TIOCOUTQ,
                                                                b"\0" * 4))[0]
            except OSError:
                continue
            if unacknowledged and peer not in self.left:
                self.ended[peer] = UNREACHABLE
                found.append(peer)
        return found

    def goodbye(self) -> None:
        """This rank is leaving the runtime of its own accord: tell every watcher, so that the
        end of its connections is not taken for a death."""
        for connection in list(self._watched.values()):
            try:
                connection.send(_GOODBYE)
            except OSError:
                pass

    def close(self) -> None:
        for connection in self._sockets():
            connection.close()
        self._watched.clear()
        self._unnamed.clear()
        self._by_fd.clear()

    def _sockets(self) -> list[socket.socket]:
        return [self._listener, *self._watched.values(), *self._unnamed]

    def _watch(self, peer: int | None, connection: socket.socket) -> None:
        connection.setblocking(False)
        if peer is None:
            self._unnamed.append(connection)
        else:
            self._watched[peer] = connection
        self._by_fd[connection.fileno()] = (peer, connection)
        self._poll.register(connection, select.POLLIN | select.POLLERR | select.POLLHUP)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            _keep_alive(connection)
            self._watch(None, connection)

    def _read(self, peer: int | None, connection: socket.socket) -> None:
        try:
            data = connection.recv(64)
            reason = None if data else GONE
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            data, reason = b"", (UNREACHABLE if e.errno in _UNREACHABLE_ERRORS else GONE)
        if peer is None:   # an accepted connection names its rank first (4 bytes, sent at once)
            if len(data) < 4:
                self._forget(connection)
                return
            peer = int.from_bytes(data[:4], "little")
            self._unnamed.remove(connection)
            self._watched[peer] = connection
            self._by_fd[connection.fileno()] = (peer, connection)
            data = data[4:]
        if _GOODBYE in data:
            self.left.add(peer)
        if reason is not None:
            self.closed.add(peer)
            if peer not in self.left:
                self.ended[peer] = reason
            self._forget(connection)
            self._watched.pop(peer, None)

    def _forget(self, connection: socket.socket) -> None:
        self._by_fd.pop(connection.fileno(), None)
        self._poll.unregister(connection)
        if connection in self._unnamed:
            self._unnamed.remove(connection)
        connection.close()


def _keep_alive(connection: socket.socket) -> None:
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                          ("TCP_KEEPCNT", KEEPALIVE_PROBES), ("TCP_USER_TIMEOUT", UNREACHABLE_SECONDS * 1000)):
        if hasattr(socket, option):   # (Linux; elsewhere the system's slower defaults apply)
            connection.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def _close_in_child() -> None:
    """A forked child (a data loader's worker) must not hold this rank's connections open: its
    watchers would not see the rank die while the child lives."""
    for liveness in list(_alive):
        for connection in liveness._sockets():
            try:
                os.close(connection.detach())
            except OSError:
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)
