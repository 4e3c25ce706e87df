"""Groups: the object that runs collectives (``group``), how groups are made and freed
(``making``), how they are named in messages and what a non-member holds (``membership``), and
the transports a group's calls run on (``transports``).

May import: ``collectives.errors``, ``collectives.calls``, ``collectives.ops``, and ``ring``.
"""
