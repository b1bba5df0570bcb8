#!/usr/bin/env bash
# Issue 14, prepared in the fourteenth session (2026-12-01), widened in the fifteenth, on one nvidia-h200: the loader
# alone on ImageNet-like photos stopped at two pipelines in 4 of 6 runs started with one (RESULTS.md, fourteenth
# session, "Found"). Two ways out, side by side with the defaults, in both orders (A B C, then C B A, two processes):
#   first2     a tuned Loader starts with two pipelines (`_first=2`)
#   remeasure  a pipeline more that paid while the loop still waits is measured once more before the next try
#              (`_remeasure=True`: pipelines.REMEASURE) instead of the next try judged against the try's own window;
#              REMEASURE and train_table.py's `_remeasure` exist only in commit 07ed697, where this ran (RESULTS.md,
#              fifteenth session): run it there
# Make the carry with `bash benchmarks/h200/prepare_carry.sh`.
#   bash benchmarks/h200/stage32.sh K     K = 1..4: staging (stage31.sh's; the ImageNet-like set in 1)
#                                          5: DALI installed, tests/test_gpu.py unless TESTS=0
#                                          6: the loader alone: the three rows in both orders, each after its tuners
#                                             settled; two, three and four pipelines given; DALI's webdataset reader
#                                          7: ResNet-18, the three rows in both orders, DALI's readers in the first
#                                          8: ResNet-50, the same
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6.. [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4) SETS2= SETS3= exec bash benchmarks/h200/stage31.sh $K ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
B='first2=dict(_first=2)' C='remeasure=dict(_remeasure=True)'  # the rows lib.sh's both_orders runs
case $K in
5) install_dali
   if [ "${TESTS:-1}" = 1 ]; then gpu_tests; fi ;;
6) both_orders alone none default --steps 200 --warmup 50 --max-warmup 400
   table $PWD alone-fixed-$tag none --rows none --steps 200 --warmup 50 \
       --extra-ff 'p2=dict(pipelines=2);p3=dict(pipelines=3);p4=dict(pipelines=4)'
   CUDA_VISIBLE_DEVICES=0 timeout 120 python3 $T --data $W/base-wds --images $W/base-images \
       --consumers none --rows dali-wds --dali-grid 0.9:4 --steps 100 --warmup 20 --json $OUT/table-dali-$tag.json \
       2>&1 | grep -E "img/s" | quiet ;;
7) both_orders r18 resnet18 default,dali --max-warmup 500 ;;
8) both_orders r50 resnet50 default,dali --max-warmup 500 ;;
esac
