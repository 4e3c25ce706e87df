"""A PMI-1 server: how MPICH's MPI_Init finds its world where no MPI launcher started the processes
(torchrun, a Kubernetes PyTorchJob, processes started one by one with ``MASTER_ADDR``, ``RANK``,
``WORLD_SIZE``). Each rank's MPICH connects to ``PMI_PORT=host:port`` as ``PMI_ID=rank`` and asks, one
line a request, for its rank and size, puts its business card, waits at barriers and gets the
others' cards; MPI moves every byte after that. The wire protocol is MPICH's "simple PMI", version 1:

==========================================  =================================================
request (``cmd=... key=value ...``)         answer
==========================================  =================================================
``initack pmiid=R``                         ``initack``, then ``set size=N``, ``set rank=R``, ``set debug=0``
``init pmi_version=1 pmi_subversion=1``     ``response_to_init pmi_version=1 pmi_subversion=1 rc=0``
``get_maxes``                               ``maxes kvsname_max=256 keylen_max=256 vallen_max=1024 rc=0``
``get_appnum`` / ``get_my_kvsname``         ``appnum appnum=0 rc=0`` / ``my_kvsname kvsname=kvs_<pid>_<random> rc=0``
``get_universe_size``                       ``universe_size size=N rc=0``
``put kvsname= key= value=``                ``put_result rc=0``
``get kvsname= key=``                       ``get_result rc=0 value=...``, or ``rc=-1 msg=key_not_found``
``barrier_in``                              ``barrier_out``, to every rank once all N are in
``finalize``                                ``finalize_ack``
``abort``                                   (the server ends: the job is over)
==========================================  =================================================

The key-value space's name is new for every server: MPICH names its shared-memory segments after
it, and a name used before met the segments a killed world left in /dev/shm (MPI_Init failed with
"Message truncated" in the round after a restart, every time). MPICH asks for ``PMI_process_mapping``, which ranks share a host (``mapping``); told there is none,
it falls back on ``hostname[r]`` keys, with which its MPI_Init can fail (ranks that disagreed on a
message's size, or UCX on an address). The server runs as a process of its own (``serve``,
started by ``start``): in a thread of rank 0 it would deadlock, since rank 0 holds the GIL inside
MPI_Init while its MPICH talks to it. It ends once every rank has finalized or closed its connection,
or when not every rank has come within ``timeout`` seconds. Only the standard library: it runs as a
file, ``python -S pmi.py SIZE TIMEOUT MAPPING``, and prints the port it listens on.

>>> reply("get_result", rc=0, value="vm")
b'cmd=get_result rc=0 value=vm\\n'
>>> parse(b"cmd=put kvsname=kvs_0 key=hostname[1] value=n1\\n")
{'cmd': 'put', 'kvsname': 'kvs_0', 'key': 'hostname[1]', 'value': 'n1'}
"""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time

def reply(cmd: str, **fields) -> bytes:
    """One answer line."""
    return ("cmd=" + cmd + "".join(f" {key}={value}" for key, value in fields.items()) + "\n").encode()


def parse(line: bytes) -> dict[str, str]:
    """One request line as its fields (a value holds no space in PMI-1)."""
    return dict(part.split("=", 1) for part in line.decode(errors="replace").split() if "=" in part)


def mapping(hosts: list[str]) -> str:
    """``PMI_process_mapping`` for ranks on ``hosts`` (one a rank, in rank order): each run of
    consecutive ranks on one host is a block ``(host's number, 1 host, ranks)``, hosts numbered as
    they first come.

    >>> mapping(["a", "a", "b", "b"]), mapping(["a", "b", "a"])
    ('(vector,(0,1,2),(1,1,2))', '(vector,(0,1,1),(1,1,1),(0,1,1))')
    """
    numbers: dict[str, int] = {}
    blocks: list[list[int]] = []
    for host in hosts:
        number = numbers.setdefault(host, len(numbers))
        if blocks and blocks[-1][0] == number:
            blocks[-1][1] += 1
        else:
            blocks.append([number, 1])
    return "(vector," + ",".join(f"({number},1,{count})" for number, count in blocks) + ")"


class World:
    """The server's state: the key-value space, the barrier, and who is still there."""

    def __init__(self, size: int, process_mapping: str):
        self.size = size
        self.kvsname = f"kvs_{os.getpid()}_{secrets.token_hex(4)}"
        self.kvs: dict[str, str] = {"PMI_process_mapping": process_mapping}
        self.lock = threading.Lock()
        self.at_barrier: list[socket.socket] = []
        self.connected = self.left = 0
        self.over = threading.Event()   # every rank finalized or went, or one aborted

    def serve(self, connection: socket.socket) -> None:
        """Answer one rank's requests until it finalizes or its connection closes."""
        with self.lock:
            self.connected += 1
        try:
            for line in connection.makefile("rb"):
                if not self.answer(connection, parse(line)):
                    break
        except OSError:
            pass
        finally:
            with self.lock:
                self.left += 1
                if self.left == self.size:
                    self.over.set()
            connection.close()

    def answer(self, connection: socket.socket, request: dict[str, str]) -> bool:
        """Answer ``request``; False once the rank is done with the server."""
        cmd, send = request.get("cmd"), connection.sendall
        if cmd == "initack":
            send(reply("initack") + reply("set", size=self.size) + reply("set", rank=request.get("pmiid", "-1"))
                 + reply("set", debug=0))
        elif cmd == "init":
            send(reply("response_to_init", pmi_version=1, pmi_subversion=1, rc=0))
        elif cmd == "get_maxes":
            send(reply("maxes", kvsname_max=256, keylen_max=256, vallen_max=1024, rc=0))
        elif cmd == "get_appnum":
            send(reply("appnum", appnum=0, rc=0))
        elif cmd == "get_my_kvsname":
            send(reply("my_kvsname", kvsname=self.kvsname, rc=0))
        elif cmd == "get_universe_size":
            send(reply("universe_size", size=self.size, rc=0))
        elif cmd == "put":
            with self.lock:
                self.kvs[request.get("key", "")] = request.get("value", "")
            send(reply("put_result", rc=0))
        elif cmd == "get":
            with self.lock:
                value = self.kvs.get(request.get("key", ""))
            send(reply("get_result", rc=-1, msg="key_not_found") if value is None else
                 reply("get_result", rc=0, value=value))
        elif cmd == "barrier_in":
            with self.lock:
                self.at_barrier.append(connection)
                if len(self.at_barrier) == self.size:
                    for waiting in self.at_barrier:
                        waiting.sendall(reply("barrier_out"))
                    self.at_barrier.clear()
        elif cmd == "finalize":
            send(reply("finalize_ack"))
            return False
        elif cmd == "abort":
            self.over.set()
            return False
        else:
            send(reply(cmd or "unknown", rc=-1, msg="not_supported_by_this_server"))
        return True


def serve(size: int, timeout: float, process_mapping: str, out=sys.stdout) -> None:
    """Listen on every interface, print the port, and serve ``size`` ranks; return once the job is
    over (every rank finalized or went, one aborted) or not every rank came within ``timeout`` s."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("", 0))
    listener.listen(size)
    print(listener.getsockname()[1], file=out, flush=True)
    world = World(size, process_mapping)
    listener.settimeout(0.2)
    give_up = time.monotonic() + timeout
    while world.connected < size and not world.over.is_set() and time.monotonic() < give_up:
        try:
            connection, _ = listener.accept()
        except socket.timeout:
            continue
        connection.settimeout(None)
        threading.Thread(target=world.serve, args=(connection,), daemon=True).start()
    listener.close()
    if world.connected == size:
        world.over.wait()


def start(hosts: list[str], timeout: float) -> tuple[subprocess.Popen, int]:
    """Start the server for ranks on ``hosts`` (one a rank) as a process of its own (in its own
    session: a signal to its rank's process group does not end the others' world); return it and its port."""
    server = subprocess.Popen([sys.executable, "-S", __file__, str(len(hosts)), str(timeout), mapping(hosts)],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    port = server.stdout.readline().strip()
    if not port.isdigit():
        server.kill()
        raise RuntimeError(f"the PMI server did not start (it said {port!r})")
    return server, int(port)


if __name__ == "__main__":
    serve(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3])
