"""Tier 2, issue 38, item 2: an elastic job grows in-process. A host discovery script lists more slots than
the ranks in use; at a commit every rank spawns newcomers that run the same program, they take
the state from rank 0 and the whole world goes on, to the weights of a run alone, bit for bit
(tests/programs/elastic_grow.py: its sums are exact for any number of ranks). A host whose rank
died is left out until the script stops listing it and lists it again. Growth onto another
host runs on two emulated hosts (scripts/emulate_hosts.sh: root only, else skipped). Every world
is bounded in time; the discovery logic itself is tested without MPI, in-process."""
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest

from collectives.elastic.discovery import Discovery
from tests.programs.elastic_grow import reference
from tests.support.hosts import SCRIPT, hostfiles_removed, kill_host, why_not
from tests.worlds import ROOT, keep_survivors, mpi_name, mpiexec, run_world


BOUND_S = 120
PROGRAM = ["tests/programs/elastic_grow.py"]
needs_mpich = pytest.mark.skipif(mpi_name() != "MPICH", reason="growth is tested under MPICH's launcher (hydra)")


def _done(output: str) -> list[tuple[int, int, int, int]]:
    """Each rank's report, (launched as, rank, size, steps): -1 for a newcomer (hydra may glue
    the lines of several ranks, hence a search rather than lines)."""
    return [tuple(map(int, found)) for found in re.findall(r"\[(-?\d+)->(\d+)/(\d+)\] done step (\d+)", output)]


@needs_mpich
@pytest.mark.quick
@pytest.mark.parametrize("how, listed, max_ranks, grown", [
    (PROGRAM, "localhost:3", None, 3),
    (["-m", "tests.programs.elastic_grow"], "localhost:8", 4, 4),   # a `python -m` program, capped by max_ranks
], ids=["script-2-to-3", "module-2-to-4-of-8-slots"])
def test_a_job_of_two_grows_by_discovery_to_the_weights_of_a_run_alone(tmp_path, how, listed, max_ranks, grown):
    out = tmp_path / "w.npy"
    args = [*how, "--steps", "40", "--discovery", f"echo {listed}", "--grow-to", str(grown), "--out", str(out)]
    result = run_world(2, args + (["--max-ranks", str(max_ranks)] if max_ranks else []), BOUND_S,
                       launcher_args=keep_survivors())
    output = result.stdout
    assert result.returncode == 0, output[-3000:]
    assert f"elastic: {grown - 2} joined: 2 -> {grown} ranks; back to step" in output, output[-3000:]
    launched = [0, 1] + [-1] * (grown - 2)   # (-1: a newcomer)
    assert sorted(_done(output)) == sorted((a, r, grown, 40) for a, r in zip(launched, range(grown))), output[-3000:]
    np.testing.assert_array_equal(np.load(out), reference(40))


@needs_mpich
@pytest.mark.quick
def test_a_killed_ranks_host_comes_back_only_once_discovery_drops_it_and_lists_it_again(tmp_path):
    """While discovery still lists the host, a commit after the death keeps 2 ranks: the cue is the
    shared log, where each discovery run and each commit that did not grow append a line (a run
    ended, then another began: the first one's listing was in place for the commits after)."""
    hosts, runs, out = tmp_path / "hosts.txt", tmp_path / "runs.log", tmp_path / "w.npy"
    hosts.write_text("localhost:3\n")
    discovery = f"cat {hosts}; echo run >> {runs}"
    command = [*mpiexec(), *keep_survivors(), "-n", "3", sys.executable, *PROGRAM, "--steps", "40", "--kill", "2:10",
               "--discovery", discovery, "--grow-to", "3", "--out", str(out), "--log", str(runs)]
    job = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(job.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        assert _wait_for(lambda: "rank 2 gone: 3 -> 2 ranks" in "".join(seen), job), "".join(seen)
        since = len(_log(runs))   # still listed: localhost is left out, so the commits go on with 2 ranks
        assert _wait_for(lambda: _kept_after_two_runs(_log(runs)[since:]), job), _log(runs)[since:]
        assert "joined" not in "".join(seen), "".join(seen)
        hosts.write_text("")
        ran = _runs(runs)
        assert _wait_for(lambda: _runs(runs) >= ran + 2, job), "the discovery script stopped running"
        hosts.write_text("localhost:3\n")   # listed again: back
        job.wait(timeout=BOUND_S)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        reader.join(timeout=10)
    output = "".join(seen)
    assert job.returncode == 0, output[-3000:]   # (it finished: the killed rank's supervisor reports 0)
    assert output.index("rank 2 gone: 3 -> 2 ranks") < output.index("elastic: 1 joined: 2 -> 3 ranks"), output
    assert sorted(_done(output)) == [(-1, 2, 3, 40), (0, 0, 3, 40), (1, 1, 3, 40)], output[-3000:]
    np.testing.assert_array_equal(np.load(out), reference(40))


@needs_mpich
@pytest.mark.quick
def test_a_newcomer_that_dies_is_left_behind_like_any_rank_and_its_host_left_out(tmp_path):
    out = tmp_path / "w.npy"
    args = [*PROGRAM, "--steps", "60", "--kill=-1:30", "--discovery", "echo localhost:3", "--out", str(out)]
    result = run_world(2, args, BOUND_S, launcher_args=keep_survivors())
    output = result.stdout
    assert result.returncode == 0, output[-3000:]
    assert output.index("elastic: 1 joined: 2 -> 3 ranks") < output.index("elastic: rank 2 gone: 3 -> 2 ranks; "
                                                                            "back to step 30"), output[-3000:]
    assert output.count("joined") == 1, "localhost is left out: nobody joins again"
    assert sorted(_done(output)) == [(0, 0, 2, 60), (1, 1, 2, 60)], output[-3000:]
    np.testing.assert_array_equal(np.load(out), reference(60))


@needs_mpich
@pytest.mark.parametrize("victim", [1, 0], ids=["a-member", "the-spawns-root"])
def test_a_member_that_dies_during_a_spawn_leaves_the_others_to_go_on_and_grow_again(tmp_path, victim):
    """MPI's spawn would wait for ever for a member that died in it: the members give it up, those
    that can go on make a world of their own (the spawn's root, in which MPI stays held by the spawn
    left behind, ends as well, and says so), and discovery grows the job again."""
    out = tmp_path / "w.npy"
    args = [*PROGRAM, "--steps", "60", "--die-spawning", str(victim), "--discovery", "echo localhost:4",
            "--grow-to", "4", "--out", str(out)]
    result = run_world(3, args, BOUND_S, launcher_args=keep_survivors())
    if _regrowth_never_started(result.stdout):
        result = run_world(3, args, BOUND_S, launcher_args=keep_survivors())
    output = result.stdout
    given_up = re.search(r"elastic: ranks? ([\d, ]+) gone: 3 -> \d ranks \(the spawn of 1 newcomer\(s\) was given up: "
                         r"rank\(s\) \[([\d, ]+)\] died\); back to step", output)
    # (the spawn's root ends at once: a member's look may find it gone beside the victim)
    assert given_up and all(str(victim) in given_up.group(k).split(", ") for k in (1, 2)), output[-3000:]
    assert re.search(r"elastic: \d joined: \d -> 4 ranks", output), output[-3000:]
    done = _done(output)
    assert len(done) == 4 and all(size == 4 and steps == 60 for _, _, size, steps in done), output[-3000:]
    np.testing.assert_array_equal(np.load(out), reference(60))


@needs_mpich
@pytest.mark.parametrize("n", [1, 2])
def test_a_newcomer_that_ends_before_it_joins_costs_the_spawns_root_which_says_so_and_never_hangs(tmp_path, n):
    """The members give the spawn up after JOIN_SECONDS + 5 s; its root, whose spawn stays inside MPI
    (holding MPI's lock nearly all the time: a probe may get through, the next call not), ends saying
    so, every time. With a member beside it, that member goes on and grows again (the next
    newcomers join): the weights of a run alone. Alone, the root's end is the job's (status 1)."""
    out, marker = tmp_path / "w.npy", tmp_path / "died"
    args = [*PROGRAM, "--steps", "30", "--die-joining", str(marker), "--discovery", f"echo localhost:{n + 1}",
            "--grow-to", str(n + 1), "--out", str(out)]
    result = run_world(n, args, BOUND_S, launcher_args=keep_survivors())
    output = result.stdout
    assert "ends before MPI starts" in output, output[-3000:]
    assert re.search(r"\[rank 0\] collectives: MPI stays held by a spawn that was given up \(the spawn of 1 "
                     r"newcomer\(s\) was given up: [^)]+\); this process cannot go on and ends", output), output[-3000:]
    if n == 1:
        assert result.returncode != 0 and not _done(output), output[-3000:]
        return
    assert "rank 0 gone: 2 -> 1 ranks (the spawn of 1 newcomer(s) was given up" in output, output[-3000:]
    assert "elastic: 2 joined: 1 -> 3 ranks" in output, output[-3000:]
    assert sorted(_done(output)) == [(-1, 1, 3, 30), (-1, 2, 3, 30), (1, 0, 3, 30)], output[-3000:]
    np.testing.assert_array_equal(np.load(out), reference(30))


@needs_mpich
@pytest.mark.quick
def test_a_launchers_notice_during_a_spawn_does_not_give_it_up(tmp_path):
    """The notice does not say whose death it tells (a rank that had just left, say); a member that
    gave the spawn up on it while the spawn ended on the others would split the job in two worlds,
    each waiting for the other. Here one member alone hears a notice inside the spawn: the newcomer
    joins all the same."""
    out = tmp_path / "w.npy"
    args = [*PROGRAM, "--steps", "30", "--notice-spawning", "1", "--discovery", "echo localhost:3",
            "--grow-to", "3", "--out", str(out)]
    result = run_world(2, args, BOUND_S, launcher_args=keep_survivors())
    output = result.stdout
    assert result.returncode == 0, output[-3000:]
    assert "elastic: 1 joined: 2 -> 3 ranks" in output and "given up" not in output, output[-3000:]
    assert sorted(_done(output)) == [(-1, 2, 3, 30), (0, 0, 3, 30), (1, 1, 3, 30)], output[-3000:]
    np.testing.assert_array_equal(np.load(out), reference(30))


@needs_mpich
@pytest.mark.quick
def test_a_newcomer_that_joined_outlives_a_later_notice_to_its_supervisor(tmp_path):
    """A supervisor ends a rank whose MPI_Init outlives a failure notice by 0.5 s (it would wait
    there for ever); a newcomer's supervisor must hear that MPI started before the joining closes
    its pipe, or any notice after the join (a late process of a spawn given up) ends a newcomer at work."""
    out = tmp_path / "w.npy"
    args = [*PROGRAM, "--steps", "40", "--notice-joined", "--sleep", "0.05", "--discovery", "echo localhost:3",
            "--grow-to", "3", "--out", str(out)]
    result = run_world(2, args, BOUND_S, launcher_args=keep_survivors())
    output = result.stdout
    assert result.returncode == 0 and "gone" not in output, output[-3000:]
    assert sorted(_done(output)) == [(-1, 2, 3, 40), (0, 0, 3, 40), (1, 1, 3, 40)], output[-3000:]
    np.testing.assert_array_equal(np.load(out), reference(40))


def _regrowth_never_started(output: str) -> bool:
    """MPICH's launcher (hydra 5.0.2) may start none of the newcomers of the spawn that follows one
    given up whose root has left (docs/elastic.md: no proxy for them 15 s in): the members give it up
    when the newcomers did not join in time, and its root ends, as the docs say. Not the runtime's
    doing: such a run is made once more."""
    return bool(re.search(r"the spawn of \d newcomer\(s\) was given up: the newcomers did not join in time",
                          output)) and "joined" not in output


GROWTH_HOSTS = "ringg"   # (a prefix of its own: tests/test_hosts.py's hosts, "ringh", are left alone)


@pytest.fixture(scope="module")
def two_hosts():
    """Two emulated hosts, ringg1 and ringg2 (scripts/emulate_hosts.sh), removed whatever happens, with the
    hostfiles of the runs killed on them."""
    why = why_not("MPICH")
    if why:
        pytest.skip(why)
    env = {**os.environ, "EMULATED_HOSTS_PREFIX": GROWTH_HOSTS}
    subprocess.run([str(SCRIPT), "up", "2"], check=True, timeout=60, capture_output=True, env=env)
    try:
        with hostfiles_removed():
            yield env
    finally:
        subprocess.run([str(SCRIPT), "down"], timeout=60, capture_output=True, env=env)


@needs_mpich
@pytest.mark.parametrize("kill", [False, True], ids=["grows-onto-another-host", "and-loses-it"])
def test_a_job_on_one_host_grows_onto_another_that_discovery_lists(two_hosts, tmp_path, kill):
    out = tmp_path / "w.npy"
    listed = f"printf '{GROWTH_HOSTS}1:2\\n{GROWTH_HOSTS}2:2\\n'"
    args = [*PROGRAM, "--steps", "60", "--discovery", listed, "--out", str(out),
            *(["--kill=-1:30"] if kill else ["--grow-to", "4"])]
    command = [str(SCRIPT), "run", "2", "--", "-disable-auto-cleanup", sys.executable, *args]
    job = subprocess.Popen(command, cwd=ROOT, env={**two_hosts, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=BOUND_S)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            for host in (f"{GROWTH_HOSTS}1", f"{GROWTH_HOSTS}2"):   # (the proxies lead sessions of their own)
                kill_host(host)
            job.communicate()
    assert job.returncode == 0, output[-3000:]
    assert "elastic: 2 joined: 2 -> 4 ranks" in output, output[-3000:]
    hosts = dict(re.findall(r"\[(-?\d+->\d+)/\d+\] done step 60 sum [\d.]+ on ([\w.-]+)", output))
    if kill:   # (the newcomers' deaths seen across hosts, through their connections: both in one change, or
        # one after the other when the second death is heard after the survivors agreed on the first)
        assert "elastic: ranks 2, 3 gone: 4 -> 2 ranks; back to step 30" in output or (
            "elastic: rank 2 gone: 4 -> 3 ranks; back to step 30" in output
            and "elastic: rank 2 gone: 3 -> 2 ranks; back to step 30" in output), output[-3000:]
        assert hosts == {"0->0": f"{GROWTH_HOSTS}1", "1->1": f"{GROWTH_HOSTS}1"}, output[-3000:]
    else:
        assert hosts == {"0->0": f"{GROWTH_HOSTS}1", "1->1": f"{GROWTH_HOSTS}1", "-1->2": f"{GROWTH_HOSTS}2",
                         "-1->3": f"{GROWTH_HOSTS}2"}, output[-3000:]
    np.testing.assert_array_equal(np.load(out), reference(60))


def _wait_for(condition, job: subprocess.Popen, seconds: float = 60) -> bool:
    give_up = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > give_up or job.poll() is not None:
            return condition()
        time.sleep(0.05)
    return True


def _kept_after_two_runs(lines: list[str]) -> bool:
    """Whether a commit kept 2 ranks after the second discovery run in ``lines`` (the first run's
    listing was in place by then: a run appends its line as it ends)."""
    runs = [i for i, line in enumerate(lines) if line == "run"]
    return len(runs) >= 2 and "commit 2" in lines[runs[1] + 1:]


def _log(path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _runs(log) -> int:
    return _log(log).count("run")


# The discovery logic, in-process (no MPI). Hosts are named by addresses: a name must resolve.

A, B = "10.0.0.1", "10.0.0.2"


@pytest.mark.quick
def test_discovery_keeps_the_last_good_list_and_says_once_why_not(tmp_path, capsys):
    listing = tmp_path / "hosts.txt"
    d = Discovery(f"cat {listing}", 1.0)
    listing.write_text(f"{A}:4\n{B}\n")
    d.poll()
    assert d.listed == {A: 4, B: 1}
    listing.write_text(f"{A}:four\n")
    d.poll()
    d.poll()
    listing.unlink()   # (cat fails)
    d.poll()
    said = capsys.readouterr().err.splitlines()
    assert d.listed == {A: 4, B: 1}, "the last good list is kept"
    assert len(said) == 2 and f"line 1: '{A}:four'" in said[0] and "exit status 1" in said[1], said
    assert all(f"keeping the last good list ({A}:4 {B}:1)" in line for line in said), said


@pytest.mark.quick
def test_discovery_offers_the_free_slots_of_each_host_up_to_the_room_left(capsys):
    d = Discovery(f"printf '{A}:2\\n{B}:3\\nno-such-host.invalid:8\\n'", 1.0)
    assert d.newcomers(Counter(), room=10) == [], "nothing before the first listing"
    d.poll()
    assert "'no-such-host.invalid', whose name does not resolve" in capsys.readouterr().err
    assert d.newcomers(Counter({A: 2, B: 1}), room=10) == [B, B]
    assert d.newcomers(Counter({A: 1}), room=2) == [A, B]
    assert d.newcomers(Counter({A: 2, B: 3}), room=10) == []


@pytest.mark.quick
def test_a_host_left_out_is_back_only_after_the_script_drops_it_and_lists_it_again(tmp_path):
    listing = tmp_path / "hosts.txt"
    listing.write_text(f"{A}:2\n{B}:2\n")
    d = Discovery(f"cat {listing}", 1.0)
    d.poll()
    d.leave_out([A])   # (a rank there died)
    d.poll()
    assert d.newcomers(Counter({B: 2}), room=10) == [], "still listed: still left out"
    listing.write_text(f"{B}:2\n")
    d.poll()
    listing.write_text(f"{A}:2\n{B}:2\n")
    d.poll()
    assert d.newcomers(Counter({B: 2}), room=10) == [A, A]
