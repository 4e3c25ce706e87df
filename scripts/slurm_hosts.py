"""The hosts of this Slurm allocation as ``host:slots`` lines, for ``--host-discovery`` (an elastic
job that grows: under mpiexec inside salloc or sbatch, see docs/slurm.md and docs/elastic.md).

    python -m trainer --elastic --host-discovery "python scripts/slurm_hosts.py" ...

The nodes from ``scontrol show hostnames $SLURM_JOB_NODELIST``, the slots of each from
``SLURM_JOB_CPUS_PER_NODE`` (Slurm's compressed list: ``2(x3),1`` is 2, 2, 2, 1).

>>> cpus_per_node("2(x3),1")
[2, 2, 2, 1]
"""
from __future__ import annotations

import os
import re
import subprocess
import sys


def cpus_per_node(compressed: str) -> list[int]:
    """Slurm's ``SLURM_JOB_CPUS_PER_NODE``, expanded."""
    counts = []
    for part in compressed.split(","):
        found = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if found is None:
            raise ValueError(f"SLURM_JOB_CPUS_PER_NODE: cannot read {compressed!r}")
        counts += [int(found.group(1))] * int(found.group(2) or 1)
    return counts


def main() -> int:
    nodes, cpus = os.environ.get("SLURM_JOB_NODELIST"), os.environ.get("SLURM_JOB_CPUS_PER_NODE")
    if not nodes or not cpus:
        print("slurm_hosts.py: not inside a Slurm allocation (no SLURM_JOB_NODELIST or SLURM_JOB_CPUS_PER_NODE)",
              file=sys.stderr)
        return 2
    hosts = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True,
                           timeout=30).stdout.split()
    counts = cpus_per_node(cpus)
    if len(counts) != len(hosts):
        print(f"slurm_hosts.py: {len(hosts)} node(s) in {nodes} but {len(counts)} in SLURM_JOB_CPUS_PER_NODE={cpus}",
              file=sys.stderr)
        return 1
    print("\n".join(f"{host}:{count}" for host, count in zip(hosts, counts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
