#!/usr/bin/env bash
# Issue 14, sixteenth session (2026-12-01), on one nvidia-h200. stage35.sh found that a GPU pipeline's build holds the
# GIL throughout (the ticker waited as long as the build: 450-575 ms beside ResNet-18/-50, 220-250 ms on an idle GPU),
# so the training step stalls while the tuner's next pipeline is built; DALI's pools filled first did not shorten it.
# Here: what the build's time is (its hardware decoder or not), and spare pipelines built before the first batch
# (settings.SPARE_PIPELINES, train_table.py's `_spares`) against the defaults, both orders, DALI's readers in the first.
# SPARE_PIPELINES and `_spares` exist only in commit 2eb58c1, where this ran (not adopted: RESULTS.md, sixteenth
# session): run K=7.. there.
#   bash benchmarks/h200/stage36.sh K     K = 1..5: staging as stage32.sh (5: with tests/test_gpu.py unless TESTS=0)
#                                          6: the probe beside ResNet-18, hw_decoder_load 0 and the default
#                                          7: ResNet-18: defaults, 1 spare, 3 spares    8: ResNet-50, the same
#                                          9: the loader alone, the same
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6.. [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4|5) exec bash benchmarks/h200/stage32.sh $K ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
B='spares1=dict(_spares=1)' C='spares3=dict(_spares=3)'  # the rows lib.sh's both_orders runs
probe() {  # $1 = name, rest: build_stall_probe.py arguments
  local name=$1; shift
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/h200/build_stall_probe.py --model resnet18 \
      --json $OUT/build-stall-$name-$tag.json "$@" 2>&1 | quiet | grep -E "build|median step"
}
case $K in
6) probe r18-hw0 --hw-decoder-load 0; probe r18 ;;
7) both_orders r18 resnet18 default,dali --max-warmup 500 ;;
8) both_orders r50 resnet50 default,dali --max-warmup 500 ;;
9) both_orders alone none default --steps 200 --warmup 50 --max-warmup 400 ;;
esac
