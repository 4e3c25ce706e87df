"""Training strategies beside the all-reduce loop of ``trainer/__main__.py``: parameter servers (``ps``)."""
