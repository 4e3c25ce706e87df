"""Which transport carries cupy arrays: decided once, the same way on every rank.

Every rank probes its own GPU (can it use one, which physical GPU is it, can NCCL
run there); one exchange of those findings over the host transport gives every
rank the whole picture, and :func:`choose` turns it into one verdict. So a rank
without a GPU makes every rank raise the same error, instead of leaving the
others waiting inside NCCL's setup for a rank that never comes.

Ranks share a GPU when they report the same host and PCI bus id, whatever their
``CUDA_VISIBLE_DEVICES`` (a scheduler that shows each rank only its own GPU makes
every rank see "device 0", on different GPUs). For example, 3 ranks on one host::

    rank  gpu               NCCL    may share a GPU     auto      nccl
    0     a/0000:1b:00.0    2.23    no
    1     a/0000:1b:00.0    2.23    no              ->  staged    error: ranks 0, 1 share a GPU
    2     a/0000:3d:00.0    2.23    no
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass

from ring import arrays
from ring.transport.gpu import nccl
from ring.transport.base import Bound, Transport, TransportError
from ring.transport.gpu.staged import StagedTransport

CHOICES = ("auto", "nccl", "staged")
MULTI_RANK_GPU_VERSION = 23000   # NCCL 2.30: the first that runs several ranks on one GPU (when enabled)
_FINDING_BYTES = 2048   # three texts of at most _TEXT_BYTES, each at most doubled by JSON's escapes
_TEXT_BYTES = 300


class Unavailable(TransportError):
    """The findings rule out what was asked for; every rank raises it alike, so they stay in step."""


@dataclass(frozen=True)
class Finding:
    """What one rank found out about its GPU."""
    problem: str = ""         # why this rank cannot use its GPU at all ("": it can)
    gpu: str = ""             # "host/PCI bus id": ranks showing the same one share a GPU
    nccl_problem: str = ""    # why NCCL cannot run on this rank ("": it can)
    nccl_version: int = 0     # e.g. 23203 for NCCL 2.32.3
    may_share_gpu: bool = False   # NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1

    def encode(self) -> bytes:
        """Fixed-length bytes for the exchange (the texts are cut to fit)."""
        fields = asdict(self)
        for name in ("problem", "gpu", "nccl_problem"):
            printable = "".join(c if c.isprintable() else " " for c in fields[name])   # no \u escapes
            cut = " ".join(printable.split()).encode()[:_TEXT_BYTES]
            fields[name] = cut.decode(errors="ignore")   # (drops a character cut in two)
        return json.dumps(fields, ensure_ascii=False).encode().ljust(_FINDING_BYTES, b" ")

    @classmethod
    def decode(cls, raw: bytes) -> "Finding":
        return cls(**json.loads(raw))


def probe(device: int | None, local_rank: int) -> Finding:
    """Make GPU ``device`` current on this rank (None: GPU ``local_rank % visible GPUs``)
    and find out what it can do."""
    try:
        if device is None:
            device = nccl.use_local_device(local_rank)
        else:
            nccl.use_device(device)
        gpu = f"{socket.gethostname()}/{nccl.pci_bus_id(device)}"
    except Exception as e:   # whatever it is (a CUDA error too), every rank must hear of it, not wait
        return Finding(problem=str(e) or type(e).__name__)
    try:
        version = nccl.version()
    except Exception as e:
        return Finding(gpu=gpu, nccl_problem=str(e) or type(e).__name__)
    enabled = os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"
    return Finding(gpu=gpu, nccl_version=version, may_share_gpu=enabled and version >= MULTI_RANK_GPU_VERSION)


def choose(findings: list[Finding], wanted: str) -> tuple[str, str]:
    """``("nccl" or "staged", why not NCCL)`` for every rank's findings, in rank order.

    ``wanted``: "nccl" (raise Unavailable if NCCL cannot carry every rank),
    "staged", or "auto" (NCCL where it can, else staged). A rank that cannot use
    its GPU at all is an error whatever is wanted.

    >>> a = Finding(gpu="h/0000:1b:00.0", nccl_version=22304)
    >>> choose([a, a], "auto")
    ('staged', 'ranks 0, 1 share GPU h/0000:1b:00.0; NCCL 2.23.4 runs several ranks on one GPU only from 2.30, with NCCL_MULTI_RANK_GPU_ENABLE=1')
    """
    if wanted not in CHOICES:
        raise ValueError(f"wanted: expected one of {CHOICES}, got {wanted!r}")
    for rank, finding in enumerate(findings):
        if finding.problem:
            raise Unavailable(f"the GPU path is not available on rank {rank}: {finding.problem}")
    why = "" if wanted == "staged" else why_not_nccl(findings)
    if wanted == "nccl" and why:
        raise Unavailable(f"NCCL cannot carry these ranks: {why}")
    return ("staged" if wanted == "staged" or why else "nccl"), why


def why_not_nccl(findings: list[Finding]) -> str:
    """Why NCCL cannot carry these ranks ("": it can)."""
    for rank, finding in enumerate(findings):
        if finding.nccl_problem:
            return f"rank {rank}: {finding.nccl_problem}"
    ranks_of: dict[str, list[int]] = {}
    for rank, finding in enumerate(findings):
        ranks_of.setdefault(finding.gpu, []).append(rank)
    for gpu, ranks in ranks_of.items():
        if len(ranks) > 1 and not all(findings[r].may_share_gpu for r in ranks):
            version = findings[ranks[0]].nccl_version
            return (f"ranks {', '.join(map(str, ranks))} share GPU {gpu}; NCCL {_dotted(version)} runs several "
                    f"ranks on one GPU only from 2.30, with NCCL_MULTI_RANK_GPU_ENABLE=1")
    return ""


def agree(host: Transport, device: int | None, wanted: str, bound: Bound) -> tuple[str, str]:
    """Probe GPU ``device`` (see :func:`probe`) on every rank of ``host`` and return the same
    verdict everywhere (see :func:`choose`); every rank of ``host`` must call this together."""
    rows = host.allgather_bytes(probe(device, host.local_rank).encode(), bound)
    return choose([Finding.decode(row) for row in rows], wanted)


def open_transport(host: Transport, device: int | None, wanted: str, bound: Bound) -> Transport:
    """The transport for cupy arrays on GPU ``device`` (None: this rank's local GPU, made
    current): NCCL or staged, the same on every rank, with its ``gpu`` and ``why_staged`` set;
    within the ``bound`` of the collective that opens it."""
    kind, why = agree(host, device, wanted, bound)
    transport = nccl.connect(host, bound) if kind == "nccl" else StagedTransport(host)
    transport.gpu, transport.why_staged = arrays.current_gpu(), why
    return transport


def _dotted(version: int) -> str:
    """NCCL's version code as its release name: 23203 -> "2.32.3", 2708 -> "2.7.8"."""
    if version < 10000:   # the code before 2.9: major * 1000 + minor * 100 + patch
        return f"{version // 1000}.{version // 100 % 10}.{version % 100}"
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
