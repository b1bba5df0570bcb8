#!/usr/bin/env bash
# Issue 14, sixteenth session (2026-12-01), on one nvidia-h200: the final tree's defaults, three runs each, beside
# DALI's readers in the same table, for ResNet-18 and ResNet-50 (README's ImageNet-like rows).
#   bash benchmarks/h200/stage37.sh K     K = 1..5: staging as stage32.sh (5: with tests/test_gpu.py unless TESTS=0)
#                                          6: ResNet-18, then ResNet-50
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6 [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4|5) exec bash benchmarks/h200/stage32.sh $K ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
case $K in
6) table $PWD r18-$tag resnet18 --rows default,dali --extra-ff 'd2=dict();d3=dict()' --max-warmup 500
   table $PWD r50-$tag resnet50 --rows default,dali --extra-ff 'd2=dict();d3=dict()' --max-warmup 500 ;;
esac
