"""Training strategies: synchronous data parallelism by all-reduce (``allreduce``, the default), replicas
that meet every H steps (``local_sgd``, ``diloco``, sharing ``periodic`` and the all-reduce loop) and
parameter servers (``ps``); ``trainer/__main__.py`` sets the run up and hands it to one."""
