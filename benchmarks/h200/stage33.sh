#!/usr/bin/env bash
# Issue 14, fifteenth session (2026-12-01), on one nvidia-h200: the pipeline tuner measures a pipeline more a second
# time before it drops it (fastfeed/pipelines.py). stage32.sh's ResNet-18 rows read the first measurement of the
# second pipeline slow in 2 of 4 runs and lost the try in one (8,492 img/s on one pipeline against 10,085-10,281).
# Does ResNet-18 now keep its second pipeline in every run, and does the loader alone still climb?
#   bash benchmarks/h200/stage33.sh K     K = 1..5: staging as stage32.sh (5: with tests/test_gpu.py)
#                                          6: ResNet-18, the defaults six times and DALI's file reader; the loader
#                                             alone, the defaults twice, and DALI's webdataset reader
#                                          7: ResNet-18, the defaults eight times (none of 6's six took a second look)
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6.. [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4|5) exec bash benchmarks/h200/stage32.sh $K ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
SIX='d2=dict();d3=dict();d4=dict();d5=dict();d6=dict()'
case $K in
6) table $PWD r18-$tag resnet18 --rows default,dali-file --extra-ff "$SIX" --max-warmup 500
   table $PWD alone-$tag none --rows default,dali-wds --extra-ff 'd2=dict()' --steps 200 --warmup 50 \
       --max-warmup 400 ;;
7) table $PWD r18x8-$tag resnet18 --rows default --extra-ff "$SIX;d7=dict();d8=dict()" --max-warmup 500 ;;
esac
