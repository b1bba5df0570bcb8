#!/usr/bin/env bash
# Issue 14, written in the sixteenth session (2026-12-01) for the next, on one nvidia-h200, not yet run: which part of
# a DALI pipeline's build holds the GIL for 450-575 ms beside training (220-250 ms on an idle GPU; stage35.sh)?
# build_stall_probe.py --part builds one part of DaliDecoder's pipeline only: the decoder (nvImageCodec's, mixed),
# resize + crop_mirror_normalize, or an external source alone, beside ResNet-18 and with no model.
#   bash benchmarks/h200/stage38.sh K     K = 1..5: staging as stage32.sh (5: with tests/test_gpu.py unless TESTS=0)
#                                          6: the four parts beside ResNet-18, then with no model
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6 [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4|5) exec bash benchmarks/h200/stage32.sh $K ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
probe() {  # $1 = model, $2 = part, rest: build_stall_probe.py arguments
  local m=$1 part=$2; shift 2
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/h200/build_stall_probe.py --model $m --part $part \
      --json $OUT/build-part-$m-$part-$tag.json "$@" 2>&1 | quiet | grep -E " build |median step"
}
case $K in
6) for part in empty decoder post full; do probe resnet18 $part; done
   for part in empty decoder post full; do probe none $part --steps 200; done ;;
esac
