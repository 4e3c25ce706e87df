"""Transports over some of the ranks of an MPI transport: a split of all of them (MPI's
Comm_split), or a group made by its members alone (Comm_create_group), whose members first tell
each other their lists (``among``). A mixin of ``ring.transport.mpi.transport.MPITransport``."""
from __future__ import annotations

from typing import Sequence

import numpy as np
from mpi4py import MPI

from ring.transport.base import Bound, CommunicatorsExhausted, TransportError
from ring.transport.mpi.errors import error_text

_SUBSET_TAG = 10   # Comm_create_group's (the tags of control.py are 8 and 9)
_MEMBERS_TAG = 11  # what the members of a group to be made by them alone say of it first (see ``among``)


class Subsets:
    """The methods of an ``MPITransport`` that make transports over some of its ranks."""

    def split(self, color: int | None, key: int, watched: bool = False) -> "Subsets | None":
        """A transport over the ranks that pass the same ``color``, ordered by ``key`` then by rank
        (MPI's Comm_split); None for ``color=None``. Every rank of this transport must call it, and
        all must be known to be here (it blocks inside MPI: there is no nonblocking split), as they
        are after a collective's cross-rank check. ``watched``: the new transport learns of
        departures through this one's control channel (see the class docstring)."""
        for peer in self._remote:
            self.control.guard(peer, None)
        try:
            comm = self.comm.Split(MPI.UNDEFINED if color is None else color, key)
        except MPI.Exception as e:
            text = error_text(e)
            failure = CommunicatorsExhausted if "too many communicators" in text.lower() else TransportError
            raise failure(f"making a communicator for a subset of the ranks failed: {text}") from e
        if comm == MPI.COMM_NULL:
            return None
        inner, outer = comm.Get_group(), self.comm.Get_group()
        mine = MPI.Group.Translate_ranks(inner, list(range(comm.Get_size())), outer)
        inner.Free()
        outer.Free()
        return type(self)(comm, [self.hosts[r] for r in mine], [self.pids[r] for r in mine],
                            [self.names[r] for r in mine], self if watched else None, self.liveness)

    def among(self, peers: Sequence[int], data: bytes, bound: Bound) -> list[bytes]:
        """Send ``data`` to each of ``peers`` (ranks of this transport, this one included) and
        receive theirs, all of its size, in the order of ``peers``: an agreement among some ranks
        while the others go on with other calls (as before ``subset``, whose Comm_create_group
        makes two different communicators, without a word, of members that list each other in
        different orders). Raises TransportTimeout once ``bound`` passes."""
        mine = np.frombuffer(data, np.uint8)
        theirs = {peer: np.empty_like(mine) for peer in peers if peer != self.rank}
        requests, waited = [], []
        try:
            for peer, buffer in theirs.items():
                requests.append(self.comm.Irecv([buffer, MPI.BYTE], peer, _MEMBERS_TAG))
                waited.append(peer)
            for peer in theirs:
                self.sending_to(peer, bound.seq)
                requests.append(self.comm.Isend([mine, MPI.BYTE], peer, _MEMBERS_TAG))
                waited.append(peer)
            self._wait_all(requests, waited, bound)
        except MPI.Exception as e:
            raise TransportError(f"exchange with ranks {[self.names[p] for p in theirs]} failed: "
                                 f"{error_text(e)}") from e
        except BaseException:
            self.give_up(requests, (mine, theirs), requests[:len(theirs)])
            raise
        return [data if peer == self.rank else theirs[peer].tobytes() for peer in peers]

    def subset(self, ranks: Sequence[int]) -> "Subsets":
        """A transport over ``ranks`` of this one, in that order, made by those ranks alone (MPI's
        Comm_create_group): the others need not call, as in torch.distributed's ``new_group`` where
        only the members make the group. It blocks inside MPI until every one of ``ranks`` calls."""
        for peer in self._remote.intersection(ranks):
            self.control.guard(peer, None)
        outer = self.comm.Get_group()
        inner = outer.Incl(list(ranks))
        try:
            comm = self.comm.Create_group(inner, _SUBSET_TAG)
        except MPI.Exception as e:
            text = error_text(e)
            failure = CommunicatorsExhausted if "too many communicators" in text.lower() else TransportError
            raise failure(f"making a communicator for ranks {list(ranks)} failed: {text}") from e
        finally:
            inner.Free()
            outer.Free()
        return type(self)(comm, [self.hosts[r] for r in ranks], [self.pids[r] for r in ranks],
                            [self.names[r] for r in ranks], None, self.liveness)
