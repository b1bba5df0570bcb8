#!/usr/bin/env bash
# Issue 14, written in the fifteenth session (2026-12-01), run in the sixteenth (RESULTS.md), on one nvidia-h200: what
# stalls the training step while the Loader builds a decode pipeline (6 of 26 ResNet-18 rows of the fifteenth session
# had a build inside their timed steps, 17-22% off the row)? `build_stall_probe.py`: a training loop on resident data,
# decoders built from another thread at steps 40 and 80 after an untimed first one (as the Loader's first pipeline),
# each decoding three batches; per phase the steps meanwhile and a 1-ms ticker's longest wait (the GIL).
#   bash benchmarks/h200/stage35.sh K     K = 1..5: staging as stage32.sh (5: with tests/test_gpu.py unless TESTS=0)
#                                          6: the probe beside ResNet-18 and ResNet-50, then the loader alone
#                                             (model none: there the builds overlap; read the GIL column only)
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6 [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4|5) exec bash benchmarks/h200/stage32.sh $K ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
probe() {  # $1 = model, rest: build_stall_probe.py arguments
  local m=$1; shift
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/h200/build_stall_probe.py --model $m \
      --json $OUT/build-stall-$m-$tag.json "$@" 2>&1 | quiet | tail -16
}
case $K in
6) probe resnet18; probe resnet50 --steps 100 --build-at 30,60; probe none --steps 200
   # the same with DALI's pools filled first (2 GiB device, 512 MiB pinned): is it the driver's allocations?
   tag=$tag-prealloc probe resnet18 --prealloc-mb 2048,512
   tag=$tag-prealloc probe resnet50 --steps 100 --build-at 30,60 --prealloc-mb 2048,512 ;;
esac
