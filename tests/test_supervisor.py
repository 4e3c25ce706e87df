"""Tier 1: the elastic supervisor's verdict on a rank held in MPI_Finalize (``_Reasons``), on a clock the
test moves and a list of the host's other processes the test sets (no launcher, no MPI)."""
import pytest

from collectives.elastic import supervisor

GRACE = supervisor._FINALIZE_GRACE


class _NoOthers:
    """The other ranks' connections (``outcome.TheOthers``): none said anything."""

    def look(self, seconds):
        pass

    def all_gone_after_a_failure(self):
        return False


@pytest.fixture
def host(monkeypatch):
    """The pids of the other processes the launcher's proxy started on this host, as the test sets them."""
    here = set()
    monkeypatch.setattr(supervisor, "_siblings", lambda: set(here))
    return here


def _reasons(local_ranks: int) -> supervisor._Reasons:
    reasons = supervisor._Reasons([], _NoOthers())
    reasons.local_ranks = local_ranks
    return reasons


def test_a_finalizing_rank_is_ended_a_grace_after_a_rank_of_its_host_ended(host):
    host.update({11, 12, 13})
    reasons = _reasons(4)
    assert reasons.to_end(b"mef") == ""   # (every other rank still runs)
    host.discard(12)
    t = 1e9   # (a moment after the looks above)
    assert reasons._held_in_finalize(t) == ""   # (the end seen now: the grace starts)
    assert reasons._held_in_finalize(t + GRACE - 0.1) == ""
    why = reasons._held_in_finalize(t + GRACE + 0.1)
    assert "MPI_Finalize has not returned" in why and "of this host ended" in why


def test_a_rank_that_ended_before_the_supervisor_ever_saw_it_counts_too(host):
    """Beside a CPU hog the rank killed in MPI_Finalize ended before this supervisor's first look: only
    the launcher's count (MPI_LOCALNRANKS) shows it (without it, the job would hang to the launch's bound)."""
    host.update({11, 12})
    reasons = _reasons(4)
    t = 1e9
    assert reasons._held_in_finalize(t) == ""
    assert "a rank of this host ended" in reasons._held_in_finalize(t + GRACE + 0.1)


def test_a_healthy_finalize_is_never_ended(host):
    host.update({11, 12, 13})
    reasons = _reasons(4)
    for t in (1e9, 1e9 + 10 * GRACE, 1e9 + 100 * GRACE):
        assert reasons._held_in_finalize(t) == ""
    host.discard(12)
    assert reasons.to_end(b"me") == ""   # (not in MPI_Finalize: the rule does not apply)


def test_a_sibling_ended_but_not_reaped_has_ended():
    """hydra's proxy reaps a child only when an event wakes it, at most one per event: a rank's supervisor
    can stay a zombie while the other ranks wait quietly in MPI_Finalize. It has ended all the same (it
    was counted running, and a finished job waited for ever: CI, once). Here a process plays the proxy:
    it starts one child that ends at once and is never reaped, and one that asks ``_siblings``."""
    import os
    import time
    proxy = os.fork()
    if proxy == 0:   # (the proxy: never reaps its first child)
        status = 1
        try:
            ended = os.fork()
            if ended == 0:
                os._exit(0)
            while open(f"/proc/{ended}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
                time.sleep(0.01)
            asking = os.fork()
            if asking == 0:
                os._exit(0 if supervisor._siblings() == set() else 1)
            _, waited = os.waitpid(asking, 0)
            status = os.waitstatus_to_exitcode(waited)
        finally:
            os._exit(status)
    _, waited = os.waitpid(proxy, 0)
    assert os.waitstatus_to_exitcode(waited) == 0, "a zombie sibling was counted as running"
