"""Host discovery for elastic growth, Horovod's convention: a script, run every few seconds, prints
the hosts that the job may use, one ``host:slots`` a line (``host`` alone: one slot)::

    $ ./discover.sh
    node1:4
    node2:4

``collectives.elastic.run(..., host_discovery="./discover.sh")`` grows the job onto the slots
listed beyond the ranks in use. Only rank 0 runs the script, in a thread of its own; a commit
asks it (``Discovery.newcomers``) where newcomers should start. A host whose ranks died is left
out ("blacklisted") until the script stops listing it and then lists it again.
"""
from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter

_SCRIPT_SECONDS = 30.0   # a script that runs longer than this (or 10 intervals) is called failed


class Discovery:
    """What the script ``script`` last listed well (run every ``interval`` seconds once started),
    and the hosts left out.

    >>> d = Discovery("echo localhost:3", 1.0)
    >>> d.poll(); d.listed
    {'localhost': 3}
    >>> d.newcomers(Counter({socket.gethostname(): 2}), room=8)
    ['localhost']
    """

    def __init__(self, script: str, interval: float):
        self.script, self.interval = script, interval
        self.listed: dict[str, int] | None = None   # the last good listing: host -> slots
        self.left_out: set[str] = set()   # hosts (as the ranks name them) whose ranks died
        self._unlisted: set[str] = set()  # of those, the ones a listing since lacked: listed again, they are back
        self._problem = ""                # the last failure said (said once, until it changes)
        self._resolved: set[str] = set()     # host names found to resolve (see _resolves)
        self._unresolved: set[str] = set()   # ... and those said not to
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._running: subprocess.Popen | None = None   # the run under way

    def start(self) -> None:
        """Run the script now and every ``interval`` seconds after, in a thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="collectives host discovery", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """No more runs; a run under way ends now, with what it started (the job is ending)."""
        self._stop.set()
        with self._lock:
            running = self._running
        if running is not None:
            _kill_session(running)

    def _run(self) -> tuple[str, str, int]:
        """One run of the script: its output, errors and exit status. It runs in a session of its
        own (the launcher's failure notices, SIGUSR1 to the rank's process group, killed a script
        running at a death: "exit status -10"); what it started ends with it if it takes too long."""
        with self._lock:
            if self._stop.is_set():
                return "", "", 0
            self._running = subprocess.Popen(self.script, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True, start_new_session=True)
        running = self._running
        try:
            out, err = running.communicate(timeout=min(_SCRIPT_SECONDS, 10 * self.interval))
            return out, err, running.returncode
        finally:
            _kill_session(running)   # (what the script left running: it ended, or took too long)
            running.communicate()
            with self._lock:
                self._running = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def poll(self) -> None:
        """Run the script once: keep what it lists, or say once why not and keep the last good list."""
        try:
            out, err, status = self._run()
            if status != 0:
                raise ValueError(f"exit status {status}: {err.strip()[-200:]}")
            listed = parse(out)
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            if not self._stop.is_set():   # (a run ended by stop is no failure of the script)
                self._say(f"{e}")
            return
        self._problem = ""
        listed = {host: slots for host, slots in listed.items() if self._resolves(host)}
        with self._lock:
            self.listed = listed
            for host in list(self.left_out):
                if not any(same_host(name, host) for name in listed):
                    self._unlisted.add(host)
                elif host in self._unlisted:   # (unlisted, then listed again: back)
                    self._unlisted.discard(host)
                    self.left_out.discard(host)

    def _resolves(self, host: str) -> bool:
        """Whether ``host``'s name resolves (said once if not; asked again at each run until it
        does): MPICH's launcher ends the whole job when it cannot start a process where asked."""
        if host in self._resolved:
            return True
        try:
            socket.getaddrinfo(host, None)
        except OSError as e:
            if host not in self._unresolved:
                self._unresolved.add(host)
                print(f"[rank 0] elastic: host discovery lists {host!r}, whose name does not resolve ({e}); "
                      "left out", file=sys.stderr, flush=True)
            return False
        self._resolved.add(host)
        return True

    def _say(self, problem: str) -> None:
        if problem != self._problem:
            self._problem = problem
            print(f"[rank 0] elastic: host discovery {self.script!r} failed ({problem}); keeping the last good "
                  f"list ({_shown(self.listed)})", file=sys.stderr, flush=True)

    def leave_out(self, hosts) -> None:
        """The ranks on ``hosts`` (as the ranks name them) died: leave those hosts out until the
        script stops listing them and lists them again."""
        with self._lock:
            self.left_out |= set(hosts)
            self._unlisted -= set(hosts)

    def newcomers(self, in_use: Counter, room: int) -> list[str]:
        """Where to start newcomers, one host name (as listed) per newcomer: the slots of each
        listed host beyond its ranks in ``in_use`` (rank count by host name, as the ranks name
        them), hosts left out skipped, at most ``room`` in all; [] before the first listing."""
        with self._lock:
            listed, left_out = dict(self.listed or {}), set(self.left_out)
        hosts = []
        for name, slots in listed.items():
            if any(same_host(name, h) for h in left_out):
                continue
            used = sum(n for h, n in in_use.items() if same_host(name, h))
            hosts += [name] * max(slots - used, 0)
        return hosts[:max(room, 0)]


def _kill_session(process: subprocess.Popen) -> None:
    """End ``process`` (a script started in a session of its own) and whatever it started there."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def parse(text: str) -> dict[str, int]:
    """A discovery script's output: ``host:slots`` (or ``host``: one slot) a line; blank lines
    and ``#`` comments skipped; a host listed twice counts once, its last slots. Raises
    ValueError for a line that is neither.

    >>> parse("node1:4\\nnode2\\n# down: node3\\n\\n")
    {'node1': 4, 'node2': 1}
    >>> parse("node1:four")
    Traceback (most recent call last):
    ValueError: line 1: 'node1:four': expected host:slots (slots a whole number >= 1)
    """
    hosts = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        host, _, slots = line.rpartition(":") if ":" in line else (line, ":", "1")
        if not host or not slots.isdigit() or int(slots) < 1 or any(c.isspace() for c in host):
            raise ValueError(f"line {number}: {line!r}: expected host:slots (slots a whole number >= 1)")
        hosts[host] = int(slots)
    return hosts


_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


def same_host(listed: str, name: str, here: str | None = None) -> bool:
    """Whether ``listed`` (a name from the script) and ``name`` (a host as a rank names it:
    its hostname) are one machine: the same name, the same up to the domain, or both this
    machine (``here``: default this one's hostname; the script runs on rank 0).

    >>> same_host("node1.cluster", "node1"), same_host("node1", "node2")
    (True, False)
    >>> same_host("localhost", "vm", here="vm"), same_host("10.0.0.1", "10.0.0.2")
    (True, False)
    """
    here = socket.gethostname() if here is None else here
    a, b = listed.lower(), name.lower()
    if a == b or _short(a) == _short(b):
        return True
    local = _LOCAL_NAMES | {here.lower(), _short(here.lower())}
    return a in local and b in local


def _short(host: str) -> str:
    """A host name without its domain (an IP address as it is)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        return host.split(".", 1)[0]


def _shown(listed: dict[str, int] | None) -> str:
    return "none yet" if listed is None else " ".join(f"{h}:{n}" for h, n in listed.items()) or "no hosts"
