#!/usr/bin/env bash
# Everything the GPU path needs checked on a machine with a GPU, in one command, every step bounded in time:
#
#   scripts/verify_gpu.sh [RESULTS_DIR]        # default: ./gpu-results
#
# It needs CuPy with NCCL, mpi4py and an mpiexec of the same MPI (pip install -e ".[mpich,test,cuda13]").
# Steps: versions; the GPU tests (tier 3: every collective against the host path over NCCL and
# staged, the all-reduce against NCCL's own, a shape that differs across ranks, CUDA tensors through
# the torch backend, the trainer against the CPU) with the tier-1 tests of the GPU transports, at 2
# ranks on one GPU over NCCL where NCCL >= 2.30 allows it (NCCL_MULTI_RANK_GPU_ENABLE=1, set here
# for every step); the bench to 256 MiB at 1 rank (our per-call overhead against NCCL's own
# allreduce) and at 2 (against NCCL where it can carry 2 ranks, else the staged ring alone); the
# reduction kernel against a device-to-device copy. Each step's output lands in RESULTS_DIR; the
# exit status is the number of steps that failed.
set -u
results=${1:-gpu-results}
mkdir -p "$results"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}.
failed=0

step() {   # step NAME SECONDS COMMAND...: run COMMAND under a time limit, output to RESULTS_DIR/NAME.txt
    local name=$1 seconds=$2
    shift 2
    echo "== $name: $*"
    timeout -k 10 "$seconds" "$@" >"$results/$name.txt" 2>&1
    local rc=$?
    tail -n 25 "$results/$name.txt"
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
}

step versions 60 bash -ec 'nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv;
    python -c "import cupy, mpi4py, numpy; from cupy.cuda import nccl; from mpi4py import MPI;
print(\"cupy\", cupy.__version__, \"cuda runtime\", cupy.cuda.runtime.runtimeGetVersion(), \"nccl\", nccl.get_version());
print(\"numpy\", numpy.__version__, \"mpi4py\", mpi4py.__version__, MPI.Get_library_version().splitlines()[0])";
    python -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, torch.cuda.is_available())" || true;
    command -v mpiexec'
if [ "$failed" -gt 0 ]; then   # (no CuPy, no GPU or no MPI: every later step would only say so again)
    echo "== no GPU path to verify here (see $results/versions.txt); stopping"
    exit 1
fi
nccl_version=$(timeout 60 python -c "from cupy.cuda import nccl; print(nccl.get_version())" 2>/dev/null || echo 0)
if [ "$nccl_version" -ge 23000 ]; then
    export NCCL_MULTI_RANK_GPU_ENABLE=1
    two_rank_impls="ring nccl"
else
    echo "== NCCL $nccl_version < 2.30: two ranks on one GPU only staged"
    two_rank_impls="ring"
fi
step tests 420 python -m pytest -q -rA --timeout 150 -p no:cacheprovider tests/test_gpu.py \
    tests/test_device_choice.py tests/test_nccl_transport.py tests/test_staged_transport.py tests/test_watchdog.py
step bench-n1 120 mpiexec -n 1 python -m bench --device cuda --max-bytes 256M --json "$results/bench-cuda-n1.json"
step bench-n2 180 mpiexec -n 2 python -m bench --device cuda --impl $two_rank_impls --max-bytes 256M \
    --json "$results/bench-cuda-n2.json"
step reduce-vs-copy 120 python scripts/reduce_vs_copy.py --device cuda
echo "== $failed step(s) failed; results in $results"
exit "$failed"
