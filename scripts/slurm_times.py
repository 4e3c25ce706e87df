"""Three figures of the trainer under Slurm, on a running (emulated) cluster, medians of RUNS:

- start: ``srun -N2 -n4`` issued to the line rank 0 prints just before the first step;
- loss: a task SIGKILLed (``srun --kill-on-bad-exit=0 ... --elastic``) to the survivors' line
  saying they go on (printed as they take their next step);
- preemption: ``scancel --signal=TERM`` to the step's checkpoint on disk.

    eval "$(scripts/emulate_slurm.sh up)"
    python scripts/slurm_times.py [RUNS]        # MPICH (--mpi=pmi2); the Open MPI venv's python: --mpi=pmix
    scripts/emulate_slurm.sh down
"""
from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLURM = [str(ROOT / "scripts" / "emulate_slurm.sh"), "run", "--"]
PMI = "--mpi=pmix" if "Open MPI" in subprocess.run([sys.executable, "-c", "from mpi4py import MPI; "
                                                    "print(MPI.Get_library_version())"],
                                                   capture_output=True, text=True).stdout else "--mpi=pmi2"
TRAINER = [sys.executable, "-m", "trainer"]


def start(*command: str) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
                   "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}   # (as tests/test_slurm.py)
    return subprocess.Popen([*SLURM, *command], cwd=ROOT, env=environment, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def until(process: subprocess.Popen, pattern: str) -> re.Match:
    """Read the output until a line matches (the time it came is the caller's clock)."""
    seen = []
    for line in process.stdout:
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    raise RuntimeError(f"no line matched {pattern!r}:\n{''.join(seen)}")


def to_first_step() -> float:
    began = time.perf_counter()
    process = start("srun", "-N2", "-n4", PMI, *TRAINER, "--epochs", "1")
    until(process, r"^training \[")
    seconds = time.perf_counter() - began
    process.communicate(timeout=120)
    return seconds


def to_survivors_next_step() -> float:
    process = start("srun", "--kill-on-bad-exit=0", "-N2", "-n3", PMI, *TRAINER, "--elastic", "--epochs", "30")
    pids = until(process, r"ranks \(pid\): 0 \((\d+)\), 1 \((\d+)\), 2 \((\d+)\)")
    until(process, r"^epoch   2/")
    killed = time.perf_counter()
    os.kill(int(pids.group(3)), signal.SIGKILL)
    until(process, r"^elastic: rank 2 gone")
    seconds = time.perf_counter() - killed
    process.communicate(timeout=120)
    return seconds


def to_checkpoint() -> float:
    with tempfile.TemporaryDirectory() as folder:
        checkpoints = Path(folder)
        process = start("srun", "-N2", "-n4", PMI, *TRAINER, "--epochs", "5000", "--checkpoint-dir", folder)
        until(process, r"^epoch   2/")
        before = set(checkpoints.glob("*_step*.npz"))
        job = subprocess.run([*SLURM, "squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()[0]
        sent = time.perf_counter()
        subprocess.run([*SLURM, "scancel", "--signal=TERM", job], check=True)
        while set(checkpoints.glob("*_step*.npz")) == before:
            time.sleep(0.005)
        seconds = time.perf_counter() - sent
        process.communicate(timeout=120)
        return seconds


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for what, measure in (("srun to the first step", to_first_step),
                          ("a task killed to the survivors going on", to_survivors_next_step),
                          ("scancel --signal=TERM to the checkpoint on disk", to_checkpoint)):
        seconds = [measure() for _ in range(runs)]
        print(f"{what} ({PMI}): median {statistics.median(seconds):.2f} s of {runs} "
              f"({', '.join(f'{s:.2f}' for s in seconds)})", flush=True)


if __name__ == "__main__":
    main()
