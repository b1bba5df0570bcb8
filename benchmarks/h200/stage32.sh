#!/usr/bin/env bash
# Issue 14, prepared in the fourteenth session (2026-12-01) for the next one, on one nvidia-h200: does a tuned GPU
# Loader that starts with two pipelines (`_first=2`) reach three or four on the loader alone where one to start
# stopped at two in 4 of 6 runs (RESULTS.md, fourteenth session, "Found"), and what does it cost the first batch and
# training? Make the carry with `bash benchmarks/h200/prepare_carry.sh`.
#   bash benchmarks/h200/stage32.sh K     K = 1..4: staging (stage31.sh's; the ImageNet-like set in 1)
#                                          5: DALI installed, tests/test_gpu.py unless TESTS=0
#                                          6: the loader alone, the defaults and `_first=2` in both orders (two
#                                             processes), each after its tuners settled; DALI's webdataset reader
#                                          7: ResNet-18 and ResNet-50, the same two rows in both orders
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6.. [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4) SETS2= SETS3= exec bash benchmarks/h200/stage31.sh $K ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
both_orders() {  # $1 = name, $2 = consumers, rest: train_table.py arguments
  local name=$1 consumers=$2; shift 2
  table $PWD $name-ab-$tag $consumers --rows default --extra-ff 'first2=dict(_first=2)' "$@"
  table $PWD $name-ba-$tag $consumers --rows none --extra-ff 'first2=dict(_first=2);ff-default=dict()' "$@"
}
case $K in
5) install_dali
   if [ "${TESTS:-1}" = 1 ]; then gpu_tests; fi ;;
6) both_orders alone none --steps 200 --warmup 50 --max-warmup 400
   CUDA_VISIBLE_DEVICES=0 timeout 120 python3 $T --data $W/base-wds --images $W/base-images \
       --consumers none --rows dali-wds --dali-grid 0.9:4 --steps 100 --warmup 20 --json $OUT/table-dali-$tag.json \
       2>&1 | grep -E "img/s" | quiet ;;
7) both_orders train resnet18,resnet50 --max-warmup 500 ;;
esac
