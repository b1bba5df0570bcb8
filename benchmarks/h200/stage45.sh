#!/usr/bin/env bash
# Issue 14, twentieth session, round 2 (2026-12-02; the change it measured was reverted after it): thumbnails now start
# on the hybrid's CPU part alone, and its climber moves a share to the GPU when the loop goes faster so
# (decode/hybrid.py). Round 1 (stage44.sh 6) had the CPU backend alone 1.17x DALI beside ResNet-50 at 64 px but 0.91x
# alone (27.6k on 9.5 cores against 30.3k on 3.0), the GPU decode alone the other way round. Expected: the defaults as
# fast as the CPU backend beside the model, as fast as the GPU decode alone; on 4 cores (DALI's 3.0 + 1, every row under
# taskset) at least DALI's rate alone.
#   bash benchmarks/h200/stage45.sh K     K = 1..4: staging as stage31.sh (SETS2 default: thumb; SETS3 default: none)
#                                          5: DALI installed; tests/test_gpu.py unless TESTS=0
#                                          6: thumbnails (64 px), alone and beside ResNet-50 and -18: the defaults,
#                                             the CPU backend (the old default), the GPU decode, DALI's webdataset
#                                             reader
#                                          7: the same, alone and beside ResNet-50, every row on cores 0-3
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6.. [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "thumb" ""
source benchmarks/h200/lib.sh
tag=${TAG:-a}
thumbs() {  # $1 = JSON name, $2 = consumers, $3 = time limit (s); CORES: taskset's core list
  tag=$1-$tag thumb_table $2 'cpu-dali=dict(decoder="cpu-dali");gpu=dict(decoder="dali")' $3
}
case $K in
5) install_dali
   [ "${TESTS:-1}" = 1 ] && gpu_tests ;;
6) thumbs all none,resnet50,resnet18 480 ;;
7) CORES=0-3 thumbs cores4 none,resnet50 400 ;;
esac
