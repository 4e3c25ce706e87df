"""A chaos run of the elastic trainer: ranks killed one after another (SIGKILL, the chief too) while
a host discovery script brings ranks back, then the same training uninterrupted; compares the
test accuracy and says whether every replica ended identical (the trainer checks it).

Each round: wait until the world is full again, wait a moment (0.2-1.2 s), kill a random rank,
take its host out of the discovery file for 1.5 s (discovery leaves a host whose rank died out
until it stops listing it and lists it again), put it back; at a commit after that, a newcomer
starts there and joins.

    scripts/emulate_hosts.sh up 2 1gbit && python scripts/elastic_chaos.py --kills 20 --hosts 2,2
    python scripts/elastic_chaos.py --kills 5 -n 3            # one host (localhost)
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOLD_OUT_S = 1.5
BOUND_S = 900


def trainer_args(n: int, hosts_file: Path, epochs: int) -> list[str]:
    return [sys.executable, "-m", "trainer", "--elastic", "--min-ranks", "1", "--max-ranks", str(n),
            "--host-discovery", f"cat {hosts_file}", "--epochs", str(epochs)]


def launch(layout: str | None, n: int, args: list[str]) -> subprocess.Popen:
    if layout:
        command = [str(ROOT / "scripts" / "emulate_hosts.sh"), "run", layout, "--", "-disable-auto-cleanup", *args]
    else:
        command = [str(Path(sys.executable).parent / "mpiexec"), "-disable-auto-cleanup", "-n", str(n), *args]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)


def ranks_of(job: subprocess.Popen) -> list[int]:
    """The pids of the job's ranks: trainer processes whose parent is a trainer process too (each
    rank runs under its supervisor, ``col.elastic.supervise``, which has the same command line)."""
    def command(pid: str) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return b""

    def parent(pid: str) -> str:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            return ""

    def trainer(pid: str) -> bool:
        argv = command(pid).split(b"\0")   # (a newcomer's: python -X collectives_joining -m trainer ...)
        return b"python" in Path(argv[0].decode()).name.encode() and b"\0-m\0trainer\0--elastic\0" in command(pid)

    trainers = {pid for pid in os.listdir("/proc") if pid.isdigit() and trainer(pid)}
    return sorted(int(pid) for pid in trainers if parent(pid) in trainers)


def host_of(pid: int, layout: str | None) -> str:
    if not layout:
        return "localhost"
    return subprocess.run(["ip", "netns", "identify", str(pid)], capture_output=True, text=True).stdout.strip()


def chaos(args, hosts_file: Path, listed: str) -> tuple[str, int, list[float]]:
    """The interrupted run: its output, the kills made, the seconds from each kill to the line of its change."""
    job = launch(args.hosts, args.n, trainer_args(args.n, hosts_file, args.epochs))
    lines, full, changed = [], threading.Event(), threading.Event()

    def read() -> None:
        for line in job.stdout:
            lines.append(line)
            print(line, end="", flush=True)
            if re.search(rf"training .* with {args.n} rank|-> {args.n} ranks", line):
                full.set()
            if "gone:" in line:
                changed.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    rng, kills, recoveries = random.Random(args.seed), 0, []
    try:
        while kills < args.kills and job.poll() is None:
            if not full.wait(timeout=1.0):
                continue
            time.sleep(rng.uniform(0.2, 1.2))
            ranks = ranks_of(job)
            if len(ranks) < args.n or job.poll() is not None:
                continue
            victim = rng.choice(ranks)
            host = host_of(victim, args.hosts)
            full.clear()
            changed.clear()
            hosts_file.write_text("".join(line + "\n" for line in listed.splitlines() if not line.startswith(host)))
            killed = time.monotonic()
            os.kill(victim, signal.SIGKILL)
            kills += 1
            print(f"chaos: kill {kills}: pid {victim} on {host}", flush=True)
            if changed.wait(timeout=30):
                recoveries.append(time.monotonic() - killed)
            time.sleep(max(0.0, HOLD_OUT_S - (time.monotonic() - killed)))
            hosts_file.write_text(listed)
        job.wait(timeout=BOUND_S)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    reader.join(timeout=10)
    return "".join(lines), kills, recoveries


def accuracy(output: str) -> float:
    found = re.findall(r"test accuracy ([\d.]+)%", output)
    return float(found[-1]) if found else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("-n", type=int, default=4, help="ranks on one host (without --hosts)")
    p.add_argument("--hosts", help="an emulated layout such as 2,2 (scripts/emulate_hosts.sh up first)")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--seed", type=int, default=1, help="the chaos's own seed (whom to kill, when)")
    args = p.parse_args()
    prefix = os.environ.get("EMULATED_HOSTS_PREFIX", "ringh")
    if args.hosts:
        slots = [int(s) for s in args.hosts.split(",")]
        args.n = sum(slots)
        listed = "".join(f"{prefix}{i + 1}:{s}\n" for i, s in enumerate(slots))
    else:
        listed = f"localhost:{args.n}\n"
    with tempfile.TemporaryDirectory() as tmp:
        hosts_file = Path(tmp) / "hosts.txt"
        hosts_file.write_text(listed)
        began = time.monotonic()
        output, kills, recoveries = chaos(args, hosts_file, listed)
        chaos_s = time.monotonic() - began
        reference = launch(args.hosts, args.n, trainer_args(args.n, hosts_file, args.epochs))
        calm = reference.communicate(timeout=BOUND_S)[0]
    changes = re.findall(r"elastic: (.*?); back to", output)
    identical = "parameters identical on every rank" in output
    print(f"\nchaos: {kills} kills, {len(changes)} changes of the world ({sum('gone' in c for c in changes)} "
          f"losses, {sum('joined' in c for c in changes)} growths) in {chaos_s:.0f} s; "
          f"kill -> change line median {sorted(recoveries)[len(recoveries) // 2] if recoveries else float('nan'):.2f} s")
    print(f"chaos: test accuracy {accuracy(output):.2f}% (uninterrupted: {accuracy(calm):.2f}%), "
          f"replicas identical: {identical}, exit status {0 if 'done:' in output else 'not done'}")
    ok = kills == args.kills and identical and abs(accuracy(output) - accuracy(calm)) <= 0.5
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
