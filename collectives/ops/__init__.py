"""The collectives' bodies, run inside a call's frame: the data collectives (``bodies``) and the
personalized ones, each rank's block to one rank (``personalized``).

May import: ``collectives.calls``, ``collectives.errors`` and ``ring``.
"""
