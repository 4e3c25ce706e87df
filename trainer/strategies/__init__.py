"""Training strategies: synchronous data parallelism by all-reduce (``allreduce``, the default) and
parameter servers (``ps``); ``trainer/__main__.py`` sets the run up and hands it to one."""
