"""The process and its world: the runtime that owns the process's state (``runtime``), the world
(MPI started lazily, the private communicator, the agreed settings: ``world``), the settings
(``config``), the world's membership changes (``changes``: survivors, newcomers), and what a
process does as it ends (``hooks``, ``leaving``).

May import: ``collectives.errors``, ``collectives.calls``, ``collectives.groups``, and ``ring``.
"""
