"""Tier 1: the process's life in one owner (``collectives.process.life``), the supervisor's protocol
(``supervision``), how a process ends (``ending``, and the supervisor's reasons on a clock the test
moves: no sleeps), and the launchers' count of ranks on this host (srun's included). No MPI."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.elastic import supervisor
from collectives.process import changes, ending, launchers, supervision
from collectives.process.ending import AtExit, Ending
from collectives.process.supervision import Heard, Word

ROOT = Path(__file__).resolve().parent.parent
LIFE_MODULES = [*(ROOT / "collectives" / "process").glob("*.py"), *(ROOT / "collectives" / "elastic").glob("*.py")]

#: srun --mpi=pmi2 starting 8 tasks on 2 nodes, as this node's task 5 sees it (PMI_* are srun's own).
SRUN_PMI2 = {"SLURM_JOB_ID": "24", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_NUM_NODES": "2",
             "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_NODEID": "1", "SLURM_PROCID": "5",
             "SLURM_MPI_TYPE": "pmi2", "PMI_FD": "7", "PMI_SIZE": "8", "PMI_RANK": "5"}


# The launchers' count of ranks on this host: one reading, the trainer's memory check and its cores alike.

def test_under_srun_pmi2_every_reader_counts_the_ranks_srun_started_on_this_node(monkeypatch):
    from cmdline import cores, memory
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", *cores.THREAD_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    for name, value in SRUN_PMI2.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert launchers.ranks_on_this_host() == 4
    assert memory.ranks_on_this_host() == 4   # (the trainer's memory check: it counted 1 a node)
    cores.share_cores_between_local_ranks()
    assert os.environ["OMP_NUM_THREADS"] == "4"   # 16 cores, 4 ranks here


@pytest.mark.parametrize("chosen", ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"])
def test_a_thread_count_already_chosen_is_kept_for_every_blas(monkeypatch, chosen):
    # torchrun sets OMP_NUM_THREADS=1; OpenBLAS reads OPENBLAS_NUM_THREADS first, so setting the others
    # would overrule that choice
    from cmdline import cores
    for name in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", *cores.THREAD_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv(chosen, "1")
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    cores.share_cores_between_local_ranks()
    assert {name: os.environ.get(name) for name in cores.THREAD_VARIABLES} == {
        name: "1" if name == chosen else None for name in cores.THREAD_VARIABLES}


@pytest.mark.parametrize("environment, ranks", [
    ({"PMI_SIZE": "4", "MPI_LOCALNRANKS": "2", **{k: v for k, v in SRUN_PMI2.items() if k.startswith("SLURM")}}, 2),
    ({"OMPI_COMM_WORLD_SIZE": "6", "OMPI_COMM_WORLD_LOCAL_SIZE": "3"}, 3),
    ({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
      "SLURM_NODEID": "0"}, 8),   # (torchrun started by srun, one task a node: torchrun's count)
    ({}, 1),
], ids=["mpiexec inside salloc", "mpirun", "torchrun under srun", "no launcher"])
def test_the_launcher_that_started_the_process_says_how_many_share_its_host(environment, ranks):
    assert launchers.ranks_on_this_host(environment) == ranks


def test_sharing_the_cores_loads_neither_numpy_nor_the_library():
    probe = ("import sys; from cmdline.cores import share_cores_between_local_ranks as share; share(); "
             "print(sorted({'numpy', 'collectives'} & sys.modules.keys()))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, **SRUN_PMI2})
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


# The supervisor's protocol: one declared set of words, said by the rank and heard by its supervisor.

def test_a_word_told_on_the_pipe_is_heard_by_the_supervisor(monkeypatch):
    told, tell = os.pipe()
    monkeypatch.setenv(supervision.PIPE, f"{tell}:{os.getpid()}")
    supervision.tell(Word.STARTED)
    supervision.tell(Word.ELASTIC)
    supervision.tell(Word.SPAWNED, last=True)   # (the last word: the pipe closes)
    supervision.tell(Word.FINALIZING)            # (said after the last: nobody hears it)
    said = os.read(told, 16)
    os.close(told)
    assert Heard.of(said) == Heard(started=True, elastic=True, spawned=True, finalizing=False)
    assert supervision.PIPE not in os.environ


def test_a_process_that_inherited_the_pipe_tells_nothing(monkeypatch):
    told, tell = os.pipe()
    monkeypatch.setenv(supervision.PIPE, f"{tell}:{os.getpid() + 1}")   # (its parent's: not this process's)
    supervision.tell(Word.STARTED)
    os.close(tell)
    assert os.read(told, 16) == b""
    os.close(told)


def test_the_words_are_one_byte_each_and_distinct():
    words = [bytes(w) for w in Word] + [bytes(o) for o in supervision.Outcome]
    assert all(len(w) == 1 for w in words) and len(set(words)) == len(words)


def test_only_the_protocol_module_spells_the_words():
    """The rank's side and the supervisor's name the words (``Word.FINALIZING``), never their bytes."""
    spelled = {bytes(w) for w in Word} | {bytes(o) for o in supervision.Outcome}
    wrong = [f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"
             for path in LIFE_MODULES if path.name != "supervision.py"
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and node.value in spelled]
    assert not wrong, "\n".join(wrong)


# One owner of the process's life.

def test_only_life_writes_the_process_life():
    """``life``'s fields are written by its own methods: the rest tells it what happened."""
    fields = set(vars(__import__("collectives.process.life", fromlist=["Life"]).Life()))
    wrong = []
    for path in sorted((ROOT / "collectives").rglob("*.py")) + sorted((ROOT / "cmdline").rglob("*.py")):
        if path.name == "life.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            wrong += [f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(t)}" for target in targets
                      for t in ast.walk(target) if isinstance(t, ast.Attribute) and t.attr in fields
                      and ast.unparse(t.value).split(".")[-1] == "life"]
    assert not wrong, "\n".join(wrong)


def test_the_process_and_elastic_modules_keep_no_state_of_the_life_in_globals():
    """The process's life is ``life``'s: no ``global`` statement in ``collectives/process`` or
    ``collectives/elastic`` but the per-call copy of the world (``startup.the_world``) and the torch
    rendezvous's own objects (the store torch gave, the PMI server's address)."""
    found = sorted((path.name, name)
                   for path in LIFE_MODULES for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Global) for name in node.names)
    assert found == [("rendezvous.py", "_given_store"), ("rendezvous.py", "server_address"), ("startup.py", "the_world")]


# How a process ends: the rank's verdict at its farewell.

@pytest.mark.parametrize("what, status", [
    (AtExit(rank=0), None),                                                          # MPI_Finalize, all well
    (AtExit(rank=0, why="uncaught KeyError"), None),                                 # the program's status
    (AtExit(rank=1, gone=(3,), lost=(3,)), 1),                                       # a death at exit
    (AtExit(rank=1, gone=(3,), lost=(3,), finished=True), 0),                        # after the elastic work
    (AtExit(rank=1, gone=(3,), lost=(3,), finished=True, why="it stopped"), 1),      # ... but its own failure
    (AtExit(rank=1, late=(2,), finished=True, patience=5), 1),                       # a late rank fails it
    (AtExit(rank=0, outlived=True), 0), (AtExit(rank=0, outlived=True, why="x"), 1),
    (AtExit(rank=0, outlived=True, finishing=False), None),
])
def test_the_verdict_at_exit(what, status):
    verdict = ending.at_exit(what)
    assert verdict.status == status
    assert bool(verdict.line) == bool(what.gone or what.late)
    assert not verdict.line or f"exiting with status {status}" in verdict.line


# How a supervised rank ends: the supervisor's reasons on a clock the test moves, then its verdict.

class Clock:
    """The supervisor's clock, moved by the test."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def move(self, seconds: float) -> None:
        self.now += seconds


class Others:
    """The other ranks' connections (``outcome.TheOthers``), as the test sets them."""

    def __init__(self, all_gone_after_a_failure=False):
        self.gone = all_gone_after_a_failure

    def look(self, seconds):
        pass

    def all_gone_after_a_failure(self):
        return self.gone


@pytest.fixture
def clock(monkeypatch):
    monkeypatch.setattr(supervisor, "_siblings", lambda: set())   # (no other process of the launcher's here)
    return Clock()


def reasons(clock, noticed=(), others=None):
    found = supervisor._Reasons(list(noticed), others or Others(), clock=clock)
    found.local_ranks = 0
    return found


def test_a_rank_left_in_mpi_init_by_a_death_is_ended_after_the_start_grace(clock):
    watch = reasons(clock, noticed=[clock.now])
    clock.move(supervisor._START_GRACE - 0.01)
    assert watch.to_end(b"") == ""
    clock.move(0.02)
    why = watch.to_end(b"")
    assert "MPI_Init would wait for it for ever" in why
    assert watch.to_end(Word.STARTED) == ""   # (once MPI has started, a notice is the runtime's business)
    verdict = ending.supervised("3", 137, Heard.of(b""), ended_because=why)
    assert verdict == Ending(1, f"[rank 3] collectives: {why}; it ends")


def test_a_rank_whose_sibling_ended_before_mpi_has_the_exit_grace_to_end_by_itself(clock, monkeypatch):
    here = {101}
    monkeypatch.setattr(supervisor, "_siblings", lambda: set(here))
    monkeypatch.setattr(supervisor, "_rank_of", lambda pid: "1")
    watch = reasons(clock)
    assert watch.to_end(b"") == ""          # (rank 1's supervisor seen)
    here.clear()                            # it ended, a usage error perhaps, which this child may share
    clock.move(supervisor._SIBLING_LOOK_SECONDS)
    assert watch.to_end(b"") == ""
    clock.move(supervisor._EXIT_GRACE)
    assert watch.to_end(b"") == ""
    clock.move(0.01)
    why = watch.to_end(b"")
    assert why.startswith("rank 1 of this job (its supervisor's pid 101, on this host) ended before MPI started")


def test_a_rank_alone_after_the_others_failed_is_ended_after_the_alone_grace(clock):
    watch = reasons(clock, others=Others(all_gone_after_a_failure=True))
    assert watch.to_end(Word.STARTED + Word.ELASTIC) == ""   # (alone from now)
    clock.move(supervisor._ALONE_GRACE)
    assert watch.to_end(Word.STARTED + Word.ELASTIC) == ""
    clock.move(0.01)
    assert "stuck in its own code" in watch.to_end(Word.STARTED + Word.ELASTIC)


def test_a_newcomer_that_never_joins_is_ended_after_the_join_seconds(clock, monkeypatch):
    monkeypatch.setattr(changes, "joining", lambda: True)
    watch = reasons(clock)
    clock.move(changes.JOIN_SECONDS)
    assert watch.to_end(Word.STARTED) == ""
    clock.move(0.01)
    assert "could not join the running job" in watch.to_end(Word.STARTED)
    assert watch.to_end(Word.STARTED + Word.SPAWNED) == ""   # (it joined: said SPAWNED)


def test_a_healthy_rank_is_never_ended(clock):
    watch = reasons(clock)
    for _ in range(5):
        clock.move(10 * changes.JOIN_SECONDS)
        assert watch.to_end(Word.STARTED + Word.ELASTIC) == ""


@pytest.mark.parametrize("status, said, finished, verdict", [
    (137, Word.STARTED + Word.ELASTIC, True, 0),      # killed, the others finished the job without it
    (137, Word.STARTED + Word.ELASTIC, False, 137),   # killed, the job failed too
    (137, Word.STARTED, True, 137),                   # killed outside an elastic job: its own status
    (1, Word.STARTED + Word.ELASTIC, True, 1),        # no signal: its own status
])
def test_the_supervisors_verdict_on_its_ranks_end(status, said, finished, verdict):
    heard = Heard.of(said)
    assert ending.supervised("2", status, heard, finished_without_it=finished).status == verdict
    assert ending.awaits_the_others(status, heard) == (status > 128 and heard.in_elastic_job)


def test_the_exit_flush_of_open_files_touches_nothing_that_warns():
    """A rank ending without MPI_Finalize flushes the program's open files, found among every object
    Python holds: its type checks touched torch's deprecated ``torch.distributed.reduce_op``, and every
    rank of a torch job that failed printed a FutureWarning at its end."""
    pytest.importorskip("torch")
    program = ("import warnings, torch.distributed\n"
               "from collectives.process import leaving\n"
               "warnings.simplefilter('error')\n"
               "leaving._flush_open_files()\n")
    result = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "Warning" not in result.stderr, result.stderr
