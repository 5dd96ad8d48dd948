#!/usr/bin/env bash
# The GPU figures the issues ask for, in one go on a borrowed GPU machine (no Ray, no internet):
#
#   RESULTS=results/gpu bash benchmarks/gpu_session.sh [stage ...]   # stages: env fit gen dws xl xl-search clf
#
#   env  what the machine is (GPU, driver, torch)
#   fit  benchmarks/fit_throughput.py on the GPU: 4,096 batched MNIST SIRENs vs one at a time (CPU)
#   gen  wall time of `zoo generate` for 70,000 MNIST INRs (14,000 real offline images x 5 views)
#   dws  benchmarks/dws_throughput.py on the GPU (fused DWS layer vs block-by-block)
#   xl   pipelines.inr_classification --scale xl on the store that `gen` wrote (MLP, DWSNet)
#   xl-search  the paper's protocol for DWSNet on that store: 100 epochs at each learning rate of
#        {5e-3, 1e-3, 5e-4, 1e-4}, the four runs side by side on the one GPU (4 CPU threads each:
#        the loader and augmentation run on the CPU, and unbounded threads make parallel runs
#        4.5x slower each), then the best validation accuracy picks the learning rate
#   clf  wall times of the paper-sized classifier zoos (`cifar10-classifiers`: 5,000 MLPs;
#        `fmnist-classifiers`: 200 runs x 149 checkpoints, 15.6 GB) with --device cuda, as
#        docs/classifiers.md ran them on the CPU; the files come from $DATA (default
#        ./shared/data): fashion-mnist/ and cifar-10/cifar-10-batches-py/ (about 120 MB: more than
#        one `device` call carries, so carry them in two calls to the warm machine)
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
STORE=${STORE:-results/inr-classification/xl/stores/xl-mnist-inr}
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(env fit gen dws xl)
LRS=${LRS:-5e-3 1e-3 5e-4 1e-4}
EPOCHS=${EPOCHS:-100}

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

timed_classifier_zoos() {
    local data=${DATA:-shared/data} kind t0 status=0
    for kind in cifar10-classifiers fmnist-classifiers; do
        local source=(--data-root "$data/fashion-mnist")
        [ $kind = cifar10-classifiers ] && source=(--dataset cifar10-unverified --data-root "$data/cifar-10")
        t0=$SECONDS
        $PY -m cli generate $kind "${source[@]}" --workers 1 --device cuda --out "results/zoos/$kind" || { status=1; continue; }
        echo "wall time for $kind: $((SECONDS - t0)) s"
        $PY -m cli info "results/zoos/$kind"
    done
    return $status
}

lr_search() {
    local lr pids=()
    for lr in $LRS; do
        OMP_NUM_THREADS=4 $PY -m cli train "$STORE" --model dwsnet --epochs "$EPOCHS" --lr "$lr" \
            --hidden-channels 48 --batch-size 512 --out "results/xl-search/lr$lr" > "results/xl-search-lr$lr.log" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    $PY - "$LRS" <<'PY'
import json, sys
rows = []
for lr in sys.argv[1].split():
    try:
        m = json.load(open(f"results/xl-search/lr{lr}/metrics.json"))
    except FileNotFoundError:
        print(f"lr {lr}: no metrics (see results/xl-search-lr{lr}.log)")
        continue
    rows.append((m["val"][0]["accuracy"], lr, m["test"][0]["accuracy"], m["best_epoch"][0], m["seconds"][0]))
for val, lr, test, epoch, sec in sorted(rows, reverse=True):
    print(f"lr {lr:>6}: val {100 * val:.2f}  test {100 * test:.2f}  best epoch {epoch}  {sec:.0f} s")
if rows:
    val, lr, test, *_ = max(rows)
    print(f"chosen on validation: lr {lr}, test accuracy {100 * test:.2f}% (paper: 85.71 +- 0.57)")
PY
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
        xl-search) stage xl-search lr_search ;;
        clf) stage clf timed_classifier_zoos ;;
        *) echo "unknown stage $s"; exit 2 ;;
    esac
done
touch "$RESULTS/done"
