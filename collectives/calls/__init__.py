"""The call machinery: one call's frame, cross-rank check and failure (``call``), the engine that
runs calls in issue order and the ``Work`` handle (``progress``), argument checks (``validate``),
what every rank must agree on (``signature``), the Chrome-trace timeline (``timeline``), byte
sizes as people write them (``sizes``), and the table of collectives (``table``).

May import: ``collectives.errors`` and ``ring``; nothing of groups, the process or elastic.
"""
