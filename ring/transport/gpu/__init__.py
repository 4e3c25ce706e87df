"""The GPU transports (CuPy): NCCL's (``nccl``), the one staged through host memory where NCCL
cannot serve (``staged``), the choice between them from every rank's findings (``device``), and
the watchdog that bounds a GPU wait (``watchdog``).

Importing CuPy starts CUDA: this package's ``__init__`` imports nothing. May import:
``ring.transport.base``, ``ring.transport.host_waits`` and ``ring``'s pure modules.
"""
