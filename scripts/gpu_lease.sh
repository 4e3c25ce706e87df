#!/usr/bin/env bash
# One lease of a lent GPU machine (docs/gpu.md, "Running the checks"), as one bounded command:
#
#   scripts/gpu_lease.sh WHEELS OUT [SECONDS]
#
# The machine has CuPy, NCCL and torch but no MPI and no network: MPICH and mpi4py come as wheels
# in WHEELS (pip download --only-binary=:all: --python-version 3.12 --no-deps mpich mpi4py pytest-mpi),
# installed into the image's Python. Then scripts/verify_gpu.sh (bounded by SECONDS, default 480:
# its steps' own limits add up to more, but on an H100 it took about 2.5 minutes), then the CPU
# bench at 4, 8 and 16 ranks, ring against MPI, one launch each. Everything lands in
# OUT/results.tgz and OUT/lease.log (the lease returns at most 8 files).
set -u
if [ $# -lt 2 ] || [ ! -d "$1" ] || [ ! -d "$2" ]; then
    echo "usage: scripts/gpu_lease.sh WHEELS_DIR OUT_DIR [SECONDS]  (both folders must exist)" >&2
    exit 2
fi
wheels=$1 out=$2 seconds=${3:-480}
results=/tmp/gpu-results
exec > >(tee "$out/lease.log") 2>&1
python3 -m pip install -q --no-index --no-deps --force-reinstall "$wheels"/*.whl || exit 90
bin=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
export PATH=$bin:$PATH
echo "== python $(command -v python3); mpiexec $(command -v mpiexec); $(nproc) cores"
timeout -k 10 "$seconds" bash scripts/verify_gpu.sh "$results"
verify=$?
tar czf "$out/results.tgz" -C "$(dirname $results)" "$(basename $results)"
for n in 4 8 16; do
    echo "== cpu bench at $n ranks"
    timeout -k 5 60 mpiexec -n "$n" python3 -m bench --impl ring mpi --max-bytes 64M \
        --json "$results/cpu-bench-n$n.json" >"$results/cpu-bench-n$n.txt" 2>&1
    echo "== cpu bench at $n ranks: exit $?"
    grep -E "^ +(8|4096|65536|1048576|16777216|67108864) |average" "$results/cpu-bench-n$n.txt"
done
tar czf "$out/results.tgz" -C "$(dirname $results)" "$(basename $results)"
exit "$verify"
