"""The runtime's settings: keyword arguments of ``init``, or environment variables, agreed at setup.

Those that change what moves between ranks (all but the timeout) are compared across ranks
when the runtime is set up: if they differ, or a rank cannot read its own, every rank raises
the same CollectiveUsageError naming the setting and each rank's value. ``col.settings()``
returns the agreed values as a read-only :class:`Settings`.

``COLLECTIVES_SEGMENT_BYTES`` / ``segment_bytes``
    Largest message the ring sends, at most 1 GiB; "4M", "64K" and plain byte counts are
    accepted. Default: 4 MiB among ranks of one host, 1 MiB where a call's ranks span
    hosts (over TCP, 4 MiB messages lost the two-level all-reduce its gain at 64 MiB:
    docs/hosts.md); a value given applies to both, 0 restores
    the defaults. Bounds the receive scratch to two segments (and to the data) and sets
    how finely reduction overlaps transfer.
``COLLECTIVES_SMALL_BYTES`` / ``small_bytes``
    The largest call that may take recursive doubling (the latency path, whose messages
    carry the whole buffer and the cross-rank check); below it the cost model chooses
    (``ring.cost``). Default and most 256 KiB; 0 turns the latency path off.
``COLLECTIVES_CHECK`` / ``check``
    1 (default): before data moves, every rank checks that all ranks make the same call
    (see ``collectives.calls.call``). 0: skip that check on the ring path to save its round trip.
``COLLECTIVES_TIMEOUT`` / ``timeout``
    Seconds a collective (and the setup) may wait for the other ranks before raising
    CollectiveError, default 600. Each collective also takes ``timeout=`` for one call.
    The only setting that may differ between ranks.
``COLLECTIVES_GPU_TRANSPORT`` / ``gpu_transport``
    How cupy arrays move: "nccl", "staged" (through host memory, over MPI) or "auto"
    (default): NCCL where it can carry every rank, else staged (see
    ``ring.transport.gpu.device``). The transport is made by ``use_local_gpu()`` (GPU
    ``local_rank() % visible GPUs``), or else by the first collective on a cupy
    array, for the GPU that array is on: one GPU per rank.
``COLLECTIVES_ALGORITHM`` / ``algorithm``
    "auto" (default): each call takes the algorithm the cost model (``ring.cost``) predicts
    fastest for its size and group, and an all-reduce that does not take recursive doubling
    takes two levels (``ring.algorithms.allreduce_two_level``) where the group's ranks span
    more than one host with the same number, more than one, on each. "ring", "halving"
    (Rabenseifner's) or "doubling" (up to ``small_bytes``, above it the ring) force that
    algorithm on every collective that has it, never two levels; "hierarchical" insists on two
    levels (refused at setup where the world's layout does not allow it). Fixed at setup;
    one call forces its own with ``algorithm=``.
``COLLECTIVES_HOSTS`` / ``hosts``
    Treat the ranks as this many hosts, consecutive blocks of ranks (0, default: the real
    hosts), to run the two-level all-reduce on one machine. Like the algorithm, fixed at setup.
``COLLECTIVES_TIMELINE`` / ``timeline``
    A file to write the timeline to at exit ("" default: none); see ``collectives.calls.timeline``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from collectives.calls import timeline as timelines
from collectives.errors import CollectiveError, CollectiveUsageError
from collectives.calls.sizes import parse_size
from ring.doubling import MAX_PAYLOAD_BYTES
from ring.transport.gpu import device as device_transports

DEFAULT_SEGMENT_BYTES = 4 << 20
NETWORK_SEGMENT_BYTES = 1 << 20   # the default where a call's ranks span hosts
MAX_SEGMENT_BYTES = 1 << 30   # MPI counts messages in ints: keep every message well below 2 GiB
DEFAULT_SMALL_BYTES = MAX_PAYLOAD_BYTES
DEFAULT_TIMEOUT = 600.0
ALGORITHMS = ("auto", "ring", "halving", "doubling", "hierarchical")


@dataclass(frozen=True)
class Settings:
    """The settings in force on this rank (see the module for each); read-only: change them with
    ``init(...)``, which every rank calls together.

    >>> s = Settings(segment_bytes=0, small_bytes=262144, check=True, timeout=600.0, gpu_transport="auto",
    ...              timeline="", algorithm="auto", hosts=0)
    >>> s.check, s.small_bytes
    (True, 262144)
    """
    segment_bytes: int
    small_bytes: int
    check: bool
    timeout: float
    gpu_transport: str
    timeline: str
    algorithm: str
    hosts: int

    def segment(self, across_hosts: bool = False) -> int:
        """The ring's segment in bytes: the setting, else its default, 4 MiB among the ranks of one
        host and 1 MiB where the call's ranks span hosts.

        >>> defaults().segment(), defaults().segment(across_hosts=True), defaults(segment_bytes=65536).segment()
        (4194304, 1048576, 65536)
        """
        return self.segment_bytes or (NETWORK_SEGMENT_BYTES if across_hosts else DEFAULT_SEGMENT_BYTES)


#: The settings that change what moves between ranks: (keyword, environment variable).
WIRE_SETTINGS = (("segment_bytes", "COLLECTIVES_SEGMENT_BYTES"), ("small_bytes", "COLLECTIVES_SMALL_BYTES"),
                 ("check", "COLLECTIVES_CHECK"), ("gpu_transport", "COLLECTIVES_GPU_TRANSPORT"),
                 ("timeline", "COLLECTIVES_TIMELINE"), ("algorithm", "COLLECTIVES_ALGORITHM"),
                 ("hosts", "COLLECTIVES_HOSTS"))
#: Settings fixed when the runtime is set up (they shape its communicators): init() cannot change them later.
SETUP_SETTINGS = ("algorithm", "hosts")
ENDED = "(ended)"   # what a rank that ended normally before its first collective says at setup


def _byte_count(raw: str) -> int:
    return parse_size(raw.strip())


def _flag(raw: str) -> bool:
    return {"0": False, "1": True}[raw.strip()]


def _count(low: int, high: int | None = None):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and low <= v <= (high if high is not None else v)


#: name: (environment variable, default, parse the environment's text, valid value?, what is expected)
_TABLE = {
    "segment_bytes": ("COLLECTIVES_SEGMENT_BYTES", 0, _byte_count, _count(0, MAX_SEGMENT_BYTES),
                      f"a byte count from 0 (the defaults) to {MAX_SEGMENT_BYTES} (1G), like 4194304 or 4M"),
    "small_bytes": ("COLLECTIVES_SMALL_BYTES", DEFAULT_SMALL_BYTES, _byte_count, _count(0, MAX_PAYLOAD_BYTES),
                    f"a byte count from 0 to {MAX_PAYLOAD_BYTES} (256K)"),
    "check": ("COLLECTIVES_CHECK", True, _flag, lambda v: isinstance(v, bool), "True/False (environment: 1 or 0)"),
    "timeout": ("COLLECTIVES_TIMEOUT", DEFAULT_TIMEOUT, float,
                lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
                "a positive number of seconds"),
    "gpu_transport": ("COLLECTIVES_GPU_TRANSPORT", "auto", str, lambda v: v in device_transports.CHOICES,
                      " or ".join(map(repr, device_transports.CHOICES))),
    "timeline": ("COLLECTIVES_TIMELINE", "", str, lambda v: isinstance(v, str), "a file name (or '' for none)"),
    "algorithm": ("COLLECTIVES_ALGORITHM", "auto", lambda raw: raw.strip(), lambda v: v in ALGORITHMS,
                  " or ".join(map(repr, ALGORITHMS))),
    "hosts": ("COLLECTIVES_HOSTS", 0, int, _count(0),
              "a number of hosts to treat consecutive blocks of ranks as (0: the real hosts)"),
}

#: (keyword, environment variable) of every setting, in the order of the table above.
VARIABLES = tuple((name, entry[0]) for name, entry in _TABLE.items())


def defaults(**changes) -> Settings:
    """The default settings (not the environment's), with ``changes``.

    >>> defaults(check=False).check, defaults().segment_bytes
    (False, 0)
    """
    return Settings(**{**{name: entry[1] for name, entry in _TABLE.items()}, **changes})


def setup_timeout(environment=os.environ) -> float:
    """The timeout as the environment sets it, before the settings are read and agreed: what bounds
    MPI's start (``COLLECTIVES_TIMEOUT``, else the default; a bad value is refused later, at setup).

    >>> setup_timeout({"COLLECTIVES_TIMEOUT": "30"}), setup_timeout({"COLLECTIVES_TIMEOUT": "soon"})
    (30.0, 600.0)
    """
    return parse_text("timeout", environment.get("COLLECTIVES_TIMEOUT", "")) or DEFAULT_TIMEOUT


def parse_text(name: str, raw: str):
    """The value an environment variable's text gives setting ``name``; None if it gives none valid.

    >>> parse_text("segment_bytes", "64K"), parse_text("check", "yes")
    (65536, None)
    """
    _, _, parse, ok, _ = _TABLE[name]
    try:
        value = parse(raw)
    except (ValueError, KeyError):
        return None
    return value if ok(value) else None


def read(given: dict, from_environment: bool, rank: int = 0) -> tuple[dict, str]:
    """The settings ``given`` as keyword arguments (None: not given), else (``from_environment``)
    from the environment, else the defaults; and the first problem found ("" if none), so that
    a rank with a bad setting can still tell the others instead of leaving them waiting."""
    settings, problem = {}, ""
    for name, (env, default, parse, ok, expected) in _TABLE.items():
        value = given.get(name)
        if value is not None:
            if not ok(value):
                problem = problem or f"init: {name}: expected {expected}, got {value!r}"
                continue
        elif from_environment and os.environ.get(env) is not None:
            value = parse_text(name, os.environ[env])
            if value is None:
                problem = problem or f"init: {env}: expected {expected}, got {os.environ[env]!r}"
                continue
        elif from_environment:
            value = default
        else:
            continue
        settings[name] = value
    if settings.get("timeline"):
        problem = problem or timelines.check_path(settings["timeline"], rank)
    return settings, problem


def record(settings: dict, problem: str, left: str = "") -> bytes:
    """What a rank brings to the setup: its wire settings, its problem with them, why it left ("")."""
    wire = {name: settings.get(name) for name, _ in WIRE_SETTINGS}
    return json.dumps({"settings": wire, "problem": problem[:400], "left": left[:400]}).encode()


def check_records(records: list[bytes]) -> None:
    """Raise the same CollectiveUsageError on every rank if any rank found a problem with its
    settings, or if the settings that change what moves between ranks differ."""
    decoded = [json.loads(r or b"{}") for r in records]
    for r, entry in enumerate(decoded):
        if entry.get("left") == ENDED:
            raise CollectiveError(f"init: rank {r} ended its program before its first collective")
        if entry.get("left"):
            raise CollectiveError(f"init: rank {r} left before its first collective: {entry['left']}")
    for r, entry in enumerate(decoded):
        if entry.get("problem"):
            raise CollectiveUsageError(f"{entry['problem']} (on rank {r}; the runtime is not set up on any rank)")
    clauses = []
    for name, env in WIRE_SETTINGS:
        values = [entry["settings"].get(name) for entry in decoded]
        if any(v != values[0] for v in values):
            shown = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values) if r == 0 or v != values[0])
            clauses.append(f"{env} / {name} differs across ranks: {shown}")
    if clauses:
        raise CollectiveUsageError("init: " + "; ".join(clauses) + " (must be the same on every rank)")
