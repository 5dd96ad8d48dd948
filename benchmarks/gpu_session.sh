#!/usr/bin/env bash
# The GPU figures the issues ask for, in one go on a borrowed GPU machine (no Ray, no internet):
#
#   RESULTS=results/gpu bash benchmarks/gpu_session.sh [stage ...]   # stages: env fit gen dws xl
#
#   env  what the machine is (GPU, driver, torch)
#   fit  benchmarks/fit_throughput.py on the GPU: 4,096 batched MNIST SIRENs vs one at a time (CPU)
#   gen  wall time of `zoo generate` for 70,000 MNIST INRs (14,000 real offline images x 5 views)
#   dws  benchmarks/dws_throughput.py on the GPU (fused DWS layer vs block-by-block)
#   xl   pipelines.inr_classification --scale xl on the store that `gen` wrote (MLP, DWSNet)
#
# Every stage runs even if an earlier one failed; each writes RESULTS/<stage>.txt, and
# RESULTS/done appears at the end. The MNIST test files must be under ./shared/data/mnist (or
# $ZOO_MNIST_TEST_ROOT); mlxtend, zarr and kornia must be importable.
set -uo pipefail
RESULTS=${RESULTS:-results/gpu}
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$RESULTS"
rm -f "$RESULTS/done"
STORE=results/inr-classification/xl/stores/xl-mnist-inr
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(env fit gen dws xl)

stage() {
    local name=$1; shift
    echo "=== $name: $* ($(date -u +%H:%M:%S))" | tee "$RESULTS/$name.txt"
    "$@" 2>&1 | tee -a "$RESULTS/$name.txt"
    echo "=== $name: exit ${PIPESTATUS[0]} ($(date -u +%H:%M:%S))" | tee -a "$RESULTS/$name.txt"
}

timed_generate() {
    local t0=$SECONDS
    # the options of pipelines/inr_classification.py's xl scale, so that `xl` reuses this store
    $PY -m cli generate mnist-inr --dataset mnist-offline-xl --limit 14000 --views 5 --chunk-size 4096 \
        --init reference --workers 1 --device cuda --out "$STORE" || return 1
    echo "wall time for $($PY -m cli info "$STORE" | grep -m1 -i networks): $((SECONDS - t0)) s"
    $PY -m cli info "$STORE"
}

for s in "${STAGES[@]}"; do
    case $s in
        env) stage env bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
             $PY -c 'import torch, zarr, pyarrow; print(torch.__version__, torch.cuda.get_device_name(), zarr.__version__, pyarrow.__version__)'; nproc" ;;
        fit) stage fit $PY benchmarks/fit_throughput.py --device cuda --networks 4096 --single 4 --steps 200 \
             --early-stop --compile ;;
        gen) stage gen timed_generate ;;
        dws) stage dws $PY benchmarks/dws_throughput.py --device cuda --batches 64 512 4096 --iters 50 --ref-iters 20 ;;
        xl) stage xl $PY -m pipelines.inr_classification --scale xl --workers 1 --out results/inr-classification ;;
        *) echo "unknown stage $s"; exit 2 ;;
    esac
done
touch "$RESULTS/done"
