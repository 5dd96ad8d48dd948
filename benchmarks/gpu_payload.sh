#!/usr/bin/env bash
# What gpu_session.sh needs on an offline GPU machine that the checkout does not hold, gathered
# into the git-ignored folder .gpu/ (at most 64 MiB travel with one `device` call, checkout included):
#
#   bash benchmarks/gpu_payload.sh [DATA]     # DATA: the shared data folder (default ../shared/data)
#
#   .gpu/wheels/  zarr, numcodecs, donfig, google-crc32c for CPython 3.12 manylinux x86_64 (the GPU
#                 machine's Python has torch, triton, numpy, pyarrow, click, tqdm, pyyaml, but not these)
#   .gpu/data/    the full official MNIST (mnist-full: 70,000 images) and Fashion-MNIST (~42 MB)
#
# Then: device run with carry [".gpu"] and the command `bash benchmarks/gpu_session.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data}
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu/wheels && mkdir -p .gpu/wheels .gpu/data
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/wheels zarr==3.1.6 numcodecs==0.17.1 donfig==0.8.1.post1 google-crc32c==1.9.0
for set in mnist-full fashion-mnist; do
    mkdir -p ".gpu/data/$set"
    cp "$DATA/$set"/*-ubyte.gz ".gpu/data/$set/"
done
du -sh .gpu .gpu/*
