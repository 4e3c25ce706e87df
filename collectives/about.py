"""This installation and this launch, in words: the facts ``python -m collectives`` prints and the
programs' notes use (the version, the MPI library, the launcher, each setting and where it came
from, the optional packages and the GPU).

>>> mpi_library()                            # doctest: +SKIP
'MPICH Version: 5.0.2 ...; threads MPI_THREAD_MULTIPLE'
"""
from __future__ import annotations

import importlib.util
import os
import platform
from importlib import metadata

import numpy as np

from collectives.calls import config
from collectives.process import launchers
from collectives.process.launchers import launcher, slurm_job  # noqa: F401 - (part of this module's words)
from collectives.calls.sizes import format_size
from ring.transport.gpu import device

try:
    VERSION = metadata.version("ringcollectives")
except metadata.PackageNotFoundError:   # run from a checkout that was not installed
    VERSION = "unknown (not installed)"

def launched_rank(environment=os.environ) -> int | None:
    """This process's rank as its launcher numbered it, known before MPI starts (None without a
    launcher, or where it does not say): lets a program speak once, from rank 0, before it starts MPI.

    >>> launched_rank({"PMI_SIZE": "2", "PMI_RANK": "1"}), launched_rank({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"})
    (1, 0)
    >>> launched_rank({"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3", "PMI_RANK": "0"}), launched_rank({})
    (3, None)
    """
    if launcher(environment) is None:
        return None
    variable = ("SLURM_PROCID" if launchers.srun_directly(environment) else
                "RANK" if launchers.torch_launched(environment) else
                "PMI_RANK" if "PMI_SIZE" in environment else "OMPI_COMM_WORLD_RANK")
    value = environment.get(variable, "")
    return int(value) if value.isdigit() else None


def launched_size(environment=os.environ) -> int | None:
    """How many processes the launcher says it started, known before MPI starts (None without a launcher).
    The world may still differ: a launcher of another MPI than mpi4py's starts worlds of one rank each.

    >>> launched_size({"PMI_SIZE": "2", "PMI_RANK": "1"}), launched_size({})
    (2, None)
    """
    started = launcher(environment)
    return int(started[2]) if started and started[2].isdigit() else None


def versions() -> str:
    """This package's version and those it runs on."""
    import mpi4py   # (lazy: importing it is cheap, but keeps this module free of MPI until asked)
    return (f"ringcollectives {VERSION}; python {platform.python_version()}, numpy {np.__version__}, "
            f"mpi4py {mpi4py.__version__}")


def mpi_library() -> str:
    """The MPI library's first line of its version, the network module asked for, and the thread level."""
    from mpi4py import MPI
    library = " ".join(MPI.Get_library_version().split("\n")[0].split())
    levels = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED", MPI.THREAD_SERIALIZED: "SERIALIZED",
              MPI.THREAD_MULTIPLE: "MULTIPLE"}
    netmod, provider = os.environ.get("MPIR_CVAR_CH4_NETMOD"), os.environ.get("FI_PROVIDER")
    network = f"{netmod}{f' provider {provider}' if netmod == 'ofi' and provider else ''}"
    why = ", set for srun --mpi=pmi2: docs/slurm.md" if launchers.chosen_network else ""
    return (f"{library}; threads MPI_THREAD_{levels.get(MPI.Query_thread(), '?')}"
            + (f"; network module {network} (MPIR_CVAR_CH4_NETMOD{why})" if netmod else ""))


#: How ``python -m collectives`` shows a setting's value (the others: ``str``).
_SHOWN = {"segment_bytes": lambda v: format_size(v) if v else "0 (4M on a host, 1M across hosts)",
          "small_bytes": format_size, "check": lambda v: "1" if v else "0", "timeline": lambda v: v or "none",
          "hosts": lambda v: str(v) if v else "0 (the real hosts)", "timeout": lambda v: f"{v:g} s"}


def settings_table(settings: config.Settings, environment=os.environ) -> list[tuple[str, str, str]]:
    """(variable, value in force, where it came from) for every setting: ``init()`` where the value
    is not what the environment (or, without the variable, the default) gives.

    >>> settings_table(config.defaults(), {"COLLECTIVES_TIMEOUT": "30"})[0]
    ('COLLECTIVES_SEGMENT_BYTES', '0 (4M on a host, 1M across hosts)', 'default')
    >>> settings_table(config.defaults(timeout=5.0), {"COLLECTIVES_TIMEOUT": "30"})[3]
    ('COLLECTIVES_TIMEOUT', '5 s', 'init()')
    """
    defaults, rows = config.defaults(), []
    for name, variable in config.VARIABLES:
        value, given = getattr(settings, name), environment.get(variable)
        if value != (getattr(defaults, name) if given is None else config.parse_text(name, given)):
            source = "init()"
        else:
            source = "default" if given is None else f"environment ({variable}={given})"
        rows.append((variable, _SHOWN.get(name, str)(value), source))
    return rows


def extras() -> list[str]:
    """The optional packages, installed or not (with the extra that brings each)."""
    found = []
    for module, what, extra in (("torch", "the torch backend 'ring'", "torch"),
                                ("ml_dtypes", "bfloat16", "bfloat16"), ("cupy", "GPU arrays", "cuda13"),
                                ("matplotlib", "plots", "plot"), ("tensorboardX", "TensorBoard files", "tensorboard")):
        installed = importlib.util.find_spec(module) is not None
        version = _version_of(module) if installed else ""
        found.append(f"{what}: {module} {version}" if installed else
                     f"{what}: not installed (pip install -e \".[{extra}]\")")
    return found


def _version_of(module: str) -> str:
    names = {"cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy"), "ml_dtypes": ("ml-dtypes",)}
    for name in names.get(module, (module,)):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return ""


def gpu(local_rank: int) -> str:
    """This rank's GPU and NCCL, or why there is none (makes GPU ``local_rank % visible`` current)."""
    if importlib.util.find_spec("cupy") is None:
        return "none (CuPy is not installed)"
    finding = device.probe(None, local_rank)
    if finding.problem:
        return f"none ({finding.problem})"
    if finding.nccl_problem:
        return f"{finding.gpu}; NCCL unusable ({finding.nccl_problem}): GPU arrays move staged, over MPI"
    code = finding.nccl_version
    return f"{finding.gpu}; NCCL {code // 10000}.{code // 100 % 100}.{code % 100}"
