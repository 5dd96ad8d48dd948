#!/usr/bin/env bash
# The GPU figures of issue 33 in one short run on a borrowed, offline GPU machine (<= 8 minutes):
#
#   bash benchmarks/gpu_payload.sh                          # here: wheels and data into .gpu/ (git-ignored)
#   RESULTS=results/gpu bash benchmarks/gpu_session.sh [stage ...]   # there, with .gpu carried
#
#   env    the machine (GPU, driver, torch, triton) and its disk's fsync'd sequential write speed
#   fit    benchmarks/fit_gpu_step.py: one fitting step of 4,096 MNIST SIRENs, the fused Triton kernel
#          in several tile / warp / precision / layout configurations vs the PyTorch step, the published
#          one-network-at-a-time recipe, gradient errors against float64; picks the fastest accurate
#          configuration for `gen` (ZOO_TRITON_CONFIG)
#   gen    `zoo generate` (through benchmarks/generate_timeline.py) of the paper's 70,000 MNIST INRs (official files, --init reference), 1,000
#          steps each without early stop, in-process on the GPU: wall time against the 20 s goal
#   clf    benchmarks/classifier_throughput.py on the GPU: the batched classifier zoos against the
#          naive one-run-at-a-time loop, bounded, no store written (measured 2026-11-27; by name only)
#   clfgen `zoo generate` (through benchmarks/generate_timeline.py, which prints when each phase ran)
#          of the paper-sized classifier zoos with their stores written (fmnist:
#          200 runs x 149 checkpoints, 15.6 GB, real Fashion-MNIST; cifar10: 5,000 networks of
#          CIFAR-shaped noise, benchmarks/synthetic_cifar.py): wall time against the 20 s / 10 s
#          goals and against the time the env stage's disk speed needs for the store's bytes
#   dws    benchmarks/dws_cuda_graph.py: a DWSNet training step, eager vs replayed from a CUDA graph
#   models benchmarks/weight_models.py --device cuda: every MNIST INR model's training step (issue 32)
#   gencells (not run by default) benchmarks/weight_models.py --device cuda on the generalization column's
#          784-128-128-128-10 classifiers at its cells' batches (8, 16, 4): the step of its costly cells
#          (nfn-np and the graph models, ~140 h of the 2-core CPU since --input-reduction reached them) on the GPU
#
# FIT_CONFIGS (the fit stage's kernel configurations) and CLF_KINDS (clfgen's zoos) override the
# defaults below, to spend a short second session on what the first left open.
#
# Each stage runs under `timeout` (STAGE_LIMITS below; the default stages 7.8 minutes in all), even if an earlier one
# failed, and appends to RESULTS/<stage>.txt; every goal prints a `goal: ... met` / `not met` line,
# gathered into RESULTS/summary.txt; RESULTS/done appears at the end (at most 8 files). Stages that
# need CUDA print `skipped: no CUDA` and exit 0 on a machine without a GPU (tested on the CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${RESULTS:-results/gpu}
PY=${PYTHON:-python3}
PAYLOAD=${PAYLOAD:-.gpu}
WORK=${WORK:-/tmp/zoo-gpu}  # stores written here (the machine's local disk)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
declare -A STAGE_LIMITS=([env]=20 [fit]=75 [gen]=60 [clf]=100 [clfgen]=150 [dws]=45 [models]=120 [gencells]=150)
mkdir -p "$RESULTS" "$WORK"
rm -f "$RESULTS/done"
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(env fit gen clfgen dws models)
FIT_CONFIGS=${FIT_CONFIGS:-16,4,split3 16,2,split3,grid 16,1,split3,grid 16,4,split3,grid 16,2,tf32x3,grid 32,2,split3,grid}
CLF_KINDS=${CLF_KINDS:-fmnist-classifiers cifar10-classifiers}

# Packages the GPU machine lacks, from the carried wheels (only those not importable already).
if [ -d "$PAYLOAD/wheels" ] && ! $PY -c 'import zarr, numcodecs, donfig, google_crc32c' 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/zoo-site "$PAYLOAD"/wheels/*.whl \
        && export PYTHONPATH=$PYTHONPATH:/tmp/zoo-site
fi

has_cuda() { $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

stage() {  # stage NAME COMMAND...: run it under its time limit, tee its output
    local name=$1; shift
    echo "=== $name: $* ($(date -u +%H:%M:%S), limit ${STAGE_LIMITS[$name]} s)" | tee "$RESULTS/$name.txt"
    # a shell function runs under `timeout` only in a new bash (the functions are exported below)
    timeout --signal=INT --kill-after=10 "${STAGE_LIMITS[$name]}" bash -c "$*" 2>&1 | tee -a "$RESULTS/$name.txt"
    local status=${PIPESTATUS[0]}
    [ "$status" = 124 ] && echo "goal: $name finished within its ${STAGE_LIMITS[$name]} s limit: not met" | tee -a "$RESULTS/$name.txt"
    echo "=== $name: exit $status ($(date -u +%H:%M:%S))" | tee -a "$RESULTS/$name.txt"
}

env_stage() {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>/dev/null || echo "no nvidia-smi"
    $PY -c 'import torch, platform; print("python", platform.python_version(), "torch", torch.__version__,
"cuda", torch.cuda.is_available() and torch.cuda.get_device_name())'
    $PY -c 'import triton; print("triton", triton.__version__)' 2>&1 | tail -1
    $PY -c 'import zarr, pyarrow; print("zarr", zarr.__version__, "pyarrow", pyarrow.__version__)' 2>&1 | tail -1
    echo "cpus $(nproc)"; df -h "$WORK" | tail -1
    # the disk's sequential write speed, fsync'd: the floor for writing a store there
    local t0=$(date +%s.%N)
    local mb=${DISK_TEST_MB:-2048}
    dd if=/dev/zero of="$WORK/dd.bin" bs=1M count=$mb conv=fsync status=none
    local t1=$(date +%s.%N)
    rm -f "$WORK/dd.bin"
    $PY -c "print(f'disk: {$mb * 1.048576:.0f} MB written and fsync\'d in {$t1 - $t0:.2f} s: {$mb * 1.048576 / ($t1 - $t0):.0f} MB/s')"
    $PY -c "print($mb * 1.048576 / ($t1 - $t0))" > "$WORK/disk_mb_s"  # for clfgen's bar
}

fit_stage() {
    has_cuda || { echo "skipped: no CUDA"; return 0; }
    $PY benchmarks/fit_gpu_step.py --networks 4096 --steps 20 --data-root "$PAYLOAD/data/mnist-full" \
        --configs $FIT_CONFIGS
}

gen_stage() {
    has_cuda || { echo "skipped: no CUDA"; return 0; }
    local best store=$WORK/mnist-70k
    best=$(sed -n 's/^BEST triton=//p' "$RESULTS/fit.txt" 2>/dev/null | tail -1)
    [ -n "$best" ] && export ZOO_TRITON_CONFIG=$best && echo "ZOO_TRITON_CONFIG=$best (from the fit stage)"
    rm -rf "$store"
    local t0=$(date +%s.%N)
    # through the phase timeline (benchmarks/generate_timeline.py): where the time beyond the kernel goes
    $PY benchmarks/generate_timeline.py generate mnist-inr --data-root "$PAYLOAD/data/mnist-full" --init reference \
        --no-early-stop --chunk-size 4096 --workers 1 --device cuda --out "$store" || return 1
    local t1=$(date +%s.%N)
    $PY -m cli info "$store"
    du -sh "$store"
    $PY -c "s = $t1 - $t0; print(f'wall time for 70,000 INRs x 1,000 steps: {s:.1f} s ({70000 / s:.0f} INRs/s; '
f'2026-11-27 with the PyTorch step on an H100: 117 s)'); print(f'goal: 70,000 paper-recipe INRs end to end < 20 s: '
f'{s:.1f} s ({\"met\" if s < 20 else \"not met\"})')"
    rm -rf "$store"
}

clf_stage() {
    has_cuda || { echo "skipped: no CUDA"; return 0; }
    # the paper-sized zoos, batched (as `zoo generate` makes its chunks, no store written) against the
    # naive loop on a subset of runs; each side stops starting work after --time-limit seconds
    $PY benchmarks/classifier_throughput.py --kind fmnist --device cuda --data-root "$PAYLOAD/data/fashion-mnist" \
        --single 4 --time-limit 15 --chunk-runs 102  # the runs zoo generate's GPU jobs group (2 jobs of 17 chunks)
    $PY benchmarks/classifier_throughput.py --kind cifar10 --device cuda --single 40 --time-limit 15
}

export -f has_cuda env_stage fit_stage gen_stage clf_stage
export RESULTS PY PAYLOAD WORK
clfgen_stage() {
    has_cuda || { echo "skipped: no CUDA"; return 0; }
    local kind goal store t0 t1 status=0
    $PY benchmarks/synthetic_cifar.py "$WORK/cifar-noise"
    for kind in $CLF_KINDS; do
        local source=(--data-root "$PAYLOAD/data/fashion-mnist") goal=20
        [ $kind = cifar10-classifiers ] && source=(--dataset cifar10-unverified --data-root "$WORK/cifar-noise") goal=10
        store=$WORK/$kind
        rm -rf "$store"
        t0=$(date +%s.%N)
        # through the phase timeline (benchmarks/generate_timeline.py: each phase's start and end, to stderr)
        $PY benchmarks/generate_timeline.py generate $kind "${source[@]}" --workers 1 --device cuda --out "$store" \
            || { status=1; continue; }
        t1=$(date +%s.%N)
        $PY -m cli info "$store" | head -12
        $PY - "$kind" "$store" "$t0" "$t1" "$goal" "$WORK/disk_mb_s" <<'PY'
import os, sys
kind, store, t0, t1, goal, disk = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
size = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(store) for f in files) / 1e6
wall = t1 - t0
floor = size / float(open(disk).read()) if os.path.exists(disk) else float("nan")
met = wall < goal or wall <= 1.25 * floor
print(f"{kind}: {wall:.1f} s for {size:,.0f} MB; writing those bytes at the disk's fsync'd speed takes {floor:.1f} s")
print(f"goal: {kind} with its store written < {goal:.0f} s or <= 1.25x the disk's time: {wall:.1f} s "
      f"({'met' if met else 'not met'})")
PY
        rm -rf "$store"
    done
    return $status
}

dws_stage() {
    has_cuda || { echo "skipped: no CUDA"; return 0; }
    $PY benchmarks/dws_cuda_graph.py --batches 64 512 --iters 50
}

models_stage() {
    has_cuda || { echo "skipped: no CUDA"; return 0; }
    # the weight-space models of issue 32 on the MNIST INRs' architecture, batch 64 (eager), each in
    # its own process (~10 s of start-up each on the GPU machine); --bf16: each also under zoo train
    # --precision bf16's autocast, alternated with its float32 steps
    $PY benchmarks/weight_models.py --device cuda --widths 2,32,32,1 --hidden-channels 48 --input-reduction 0 \
        --batch 64 --iters 5 --bf16 --models dwsnet,nfn-np,nfn-hnp,ng-gnn,ng-transformer,scalegmn,scalegmn-b
}

gencells_stage() {
    has_cuda || { echo "skipped: no CUDA"; return 0; }
    # the benchmark's default networks and models are the column's (784-128-128-128-10 ReLU classifiers,
    # d0' = 16 for every model, 16 channels); each batch as pipelines/weight_models.py gives the cell
    # (GRAPH_BATCH_SIZES), each run with its own DWSNet row for the ratio
    $PY benchmarks/weight_models.py --device cuda --batch 8 --iters 5 --models nfn-np,scalegmn
    $PY benchmarks/weight_models.py --device cuda --batch 16 --iters 5 --models ng-gnn
    $PY benchmarks/weight_models.py --device cuda --batch 4 --iters 5 --models ng-transformer,scalegmn-b
}

export -f dws_stage models_stage clfgen_stage gencells_stage
export FIT_CONFIGS CLF_KINDS
for s in "${STAGES[@]}"; do
    case $s in
        env) stage env env_stage ;;
        fit) stage fit fit_stage ;;
        gen) stage gen gen_stage ;;
        clf) stage clf clf_stage ;;
        clfgen) stage clfgen clfgen_stage ;;
        dws) stage dws dws_stage ;;
        models) stage models models_stage ;;
        gencells) stage gencells gencells_stage ;;
        *) echo "unknown stage $s (env fit gen clf clfgen dws models gencells)"; exit 2 ;;
    esac
done
grep -h '^goal:' "$RESULTS"/*.txt > "$RESULTS/summary.txt" 2>/dev/null
cat "$RESULTS/summary.txt"
touch "$RESULTS/done"
