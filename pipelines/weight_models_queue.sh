#!/usr/bin/env bash
# Issue 32's table, every cell in one background queue, in the order of the issue's goals:
#
#   nohup bash pipelines/weight_models_queue.sh [RESULTS] > RESULTS/weight-models/logs/queue.log 2>&1 &
#
# RESULTS (default: results/ in this checkout, git-ignored) holds the zoos (made on first use) and the
# cells. Each stage is one `python -m pipelines.weight_models` command: a rerun reuses a finished cell
# and resumes an unfinished one after its last completed epoch, so after an interruption, a reboot or
# a new machine, the same command goes on where the work stands (on a new machine: from the start).
# A stage that fails is said in the log, and the queue goes on with the next.
#
# Order (docs/train.md, "Filling the table"): ScaleGMN's MNIST cells first (the >= 96.6% goal; its full
# cell is ~12-13 h of a 2-core CPU with AVX-512 bfloat16, session 12), then ng-gnn's MNIST ones (the
# paper's 91.4%, against 33-35% at ci: ~3 h, so an answer, and time to look into a miss, before
# ScaleGMN's ~13 h Fashion-MNIST cells (>= 80.8%), session 14), the cheap models and the NFNs, the other
# graph models, then the other columns; last, the MNIST full cells that sessions 1-11 recorded
# (DWSNet, the NFNs) but whose run directories were lost.
set -u
cd "$(dirname "$0")/.."
R=$(realpath -m "${1:-results}")
L=$R/weight-models/logs
mkdir -p "$L"
# a CPU shared with other jobs (docs/train.md): OpenMP threads sleep between operators, no mmapped buffers
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} MALLOC_MMAP_MAX_=${MALLOC_MMAP_MAX_:-0}
# progress bars into a log file: a line every 30 s, not one per batch (a full cell's log stays ~1 MB, not ~10)
export TQDM_MININTERVAL=${TQDM_MININTERVAL:-30}
CHEAP=mlp,mlp-align,dwsnet,nfn-hnp,nfn-np

stage() {  # stage NAME COLUMN SCALE MODELS [STORES]; MODELS "": every model the column applies to
    local name=$1 column=$2 scale=$3 models=$4 stores=${5:-$R/inr-classification}
    echo "$(date -u +%FT%TZ) start $name"
    nice -n 19 python -m pipelines.weight_models --column "$column" --scale "$scale" --models "$models" \
        --stores "$stores" --out "$R/weight-models" > "$L/$name.log" 2>&1
    local status=$?
    echo "$(date -u +%FT%TZ) end $name (exit $status)"
}

stage ci-mnist-scalegmn mnist ci scalegmn
stage full-mnist-scalegmn mnist full scalegmn
stage ci-mnist-ng-gnn mnist ci ng-gnn
stage full-mnist-ng-gnn mnist full ng-gnn
stage ci-fmnist-scalegmn fmnist ci scalegmn
stage full-fmnist-scalegmn fmnist full scalegmn
stage ci-mnist-cheap mnist ci $CHEAP
stage ci-fmnist-cheap fmnist ci $CHEAP
stage full-mnist-mlps mnist full mlp,mlp-align
stage full-fmnist-cheap fmnist full $CHEAP
stage ci-mnist-graphs mnist ci ng-transformer,scalegmn-b
stage ci-fmnist-graphs fmnist ci ng-gnn,ng-transformer,scalegmn-b
stage full-fmnist-ng-gnn fmnist full ng-gnn
stage full-mnist-graphs mnist full scalegmn-b,ng-transformer
stage full-fmnist-graphs fmnist full scalegmn-b,ng-transformer
stage ci-sine sine ci "" "$R/sine-regression"
stage ci-adapt adapt ci "" "$R/domain-adaptation"
stage ci-generalization generalization ci $CHEAP "$R/generalization"
stage full-generalization generalization full $CHEAP "$R/generalization"
stage ci-generalization-graphs generalization ci ng-gnn,scalegmn,ng-transformer,scalegmn-b "$R/generalization"
stage full-generalization-graphs generalization full ng-gnn,scalegmn,ng-transformer,scalegmn-b "$R/generalization"
# recorded in sessions 1-11 with their commands (docs/train.md), run directories lost with session 12's machine
stage full-mnist-recorded mnist full dwsnet,nfn-hnp,nfn-np
python -m pipelines.weight_models --summary --out "$R/weight-models" > "$L/summary.log" 2>&1
echo "$(date -u +%FT%TZ) queue done: $R/weight-models/summary.md"
