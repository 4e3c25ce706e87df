"""What the two programs (``python -m trainer``, ``python -m bench``) share on their command line:
``cmdline.cores`` (BLAS threads per rank, set before numpy loads) and ``cmdline.parser`` (usage
errors said once, by rank 0). Built on the public API of ``collectives`` alone."""
