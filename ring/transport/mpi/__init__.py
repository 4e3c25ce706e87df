"""The MPI transport (mpi4py, host memory): the data plane (``transport``), point-to-point
(``p2p``), its setup (``setup``) and subsets (``subsets``), the one poll loop every wait runs
(``waiting``), the control plane beside it (``control``: departures, deaths, the roll call;
``exits``: the farewell and the exit barrier; ``liveness``: peers on other hosts; ``notices``:
the launcher's failure notices), the survivors' agreement after a death (``survivors``) and
MPI's errors in words (``errors``).

Importing a module here that imports mpi4py starts MPI: this package's ``__init__`` imports
nothing. May import: ``ring.transport.base``, ``ring.transport.host_waits`` and ``ring``'s pure modules.
"""
