#!/usr/bin/env bash
# Issue 14, fifteenth session (2026-12-01), on one nvidia-h200: the hybrid's climber judges a first CPU share on
# two windows of it against two of the GPU alone before it keeps it (fastfeed/decode/hybrid.py). stage33.sh's
# ResNet-18 rows ended on a share of 1/8-1/4 in 3 of 14 runs, 3-7% slower. Does ResNet-18 now stay on the GPU alone,
# and does ResNet-50 train as before?
#   bash benchmarks/h200/stage34.sh K     K = 1..5: staging as stage32.sh (5: with tests/test_gpu.py)
#                                          6: ResNet-18, the defaults twelve times
#                                          7: ResNet-50, the defaults three times and DALI's file reader
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6.. [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4|5) exec bash benchmarks/h200/stage32.sh $K ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
MORE='d2=dict();d3=dict();d4=dict();d5=dict();d6=dict();d7=dict();d8=dict();d9=dict();d10=dict();d11=dict()'
case $K in
6) table $PWD r18x12-$tag resnet18 --rows default --extra-ff "$MORE;d12=dict()" --max-warmup 500 ;;
7) table $PWD r50-$tag resnet50 --rows default,dali-file --extra-ff 'd2=dict();d3=dict()' --max-warmup 500 ;;
esac
