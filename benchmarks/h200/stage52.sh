#!/usr/bin/env bash
# Issue 14, for the twenty-third session (written 2026-12-02, not yet run), on one nvidia-h200: on 16 cores, does the
# hybrid (the defaults for ImageNet-like photos: GPU decode plus a CPU share tuned on the loop) cost ResNet-18 ~4-6%
# against the pure GPU decode, and give ResNet-50 1-4%? The twenty-second session's tables said so in 3-4 of 4 tables
# each, inside the spread between processes (benchmarks/RESULTS.md). Here each table is one process with the two rows
# in alternating order, DALI's readers in every other process, four processes per model.
#   bash benchmarks/h200/stage52.sh K     K = 1..4: staging as stage31.sh (SETS2, SETS3 default: none)
#                                          5: DALI and Lightning installed; the GPU tests unless TESTS=0
#                                          6: ResNet-18, four processes; 7: ResNet-50, four processes
#                                          8: bench_first_step.py on the DALI path (ResNet-50, batch 256): the
#                                             defaults, nothing before the first next(), decoding before it too
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK],
# K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. []. Each step from 5 packs $OUT into one archive (bundle_out, lib.sh).
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "" ""
source benchmarks/h200/lib.sh
tag=${TAG:-a}
alternate() {  # $1 = consumer: four processes, gpu and the defaults in turn first, DALI's readers in the 1st and 3rd
  local n rows ff
  for n in 1 2 3 4; do
    if [ $((n % 2)) = 1 ]; then rows=default,dali ff='gpu=dict(decoder="dali")'
    else rows=none ff='gpu=dict(decoder="dali");ff-default=dict()'; fi
    table $PWD hybrid-$1-$n-$tag $1 --rows $rows --extra-ff "$ff"
  done
}
case $K in
5) install_and_test ;;
6) alternate resnet18 ;;
7) alternate resnet50 ;;
8) CUDA_VISIBLE_DEVICES=0 timeout 300 python3 benchmarks/bench_first_step.py $W/base-wds --device cuda \
       --model resnet50 --batch 256 --rounds 2 --json $OUT/first-step-$tag.json 2>&1 | quiet | tail -14 ;;
esac
[ $K -ge 5 ] && bundle_out stage52-$K-$tag
