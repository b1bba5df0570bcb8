#!/usr/bin/env bash
# Issue 14, written for the twenty-fourth session and run in it (2026-12-02), on one nvidia-h200: fastfeed's median
# training step equals DALI's file reader's, its slow steps do not (twenty-third session: ResNet-18 p99 62-65 ms
# against 32-39). Which loader events do the steps over the 90th percentile follow? train_table.py --per-step records,
# per timed step, the decode time of fastfeed's workers inside it, the builds, the tuners' changes, collections and
# epoch starts, and logs the slow steps against the rest (Timeline, slow_steps).
#   bash benchmarks/h200/stage53.sh K     K = 1..4: staging as stage31.sh (SETS2, SETS3 default: none)
#                                          5: DALI and Lightning installed; the GPU tests unless TESTS=0
#                                          6: ResNet-18, 300 timed steps after up to 500 of warm-up: the defaults,
#                                             the GPU decode and DALI's file reader, two processes in both orders
#                                          7: the same with ResNet-50
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK],
# K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. []. Each step from 5 packs $OUT into one archive (bundle_out, lib.sh).
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "" ""
source benchmarks/h200/lib.sh
tag=${TAG:-a}
steps() {  # $1 = consumer: two processes, the fastfeed rows in both orders, DALI's file reader in each
  local gpu='gpu=dict(decoder="dali")'
  table $PWD slow-$1-1-$tag $1 --per-step --steps 300 --max-warmup 500 --rows default,dali-file --extra-ff "$gpu"
  table $PWD slow-$1-2-$tag $1 --per-step --steps 300 --max-warmup 500 --rows dali-file \
      --extra-ff "$gpu;ff-default=dict()"
}
case $K in
5) install_and_test ;;
6) steps resnet18 ;;
7) steps resnet50 ;;
esac
[ $K -ge 5 ] && bundle_out stage53-$K-$tag
