#!/usr/bin/env bash
# Issue 14, sixth session (2026-11-30/12-01), profile before guessing: why a ResNet-50 step is slower beside fastfeed
# than beside DALI's reader (the training thread's slow CUDA calls, and what the other threads were doing meanwhile),
# and where 12-MP photos lose to DALI (benchmarks/h200/phone_probe.py takes the chain apart).
#   bash benchmarks/h200/stage22.sh K     K = 1..4 staging (stage18.sh's; only the phone set in 2)
#                                          5: DALI installed; the 12-MP probe; ResNet-50 step profiles + their reading
#   Round 2 (large photos: hw_decoder_load 0.9 and 4 threads by default), after 1-4:
#                                          6: DALI installed; pytest -m gpu; 12-MP photos alone and in ResNet-50,
#                                             the new default against the old setting and DALI's best row
#                                          7: ResNet-50 and -18 on ImageNet-like photos: DALI's own setting inside
#                                             fastfeed, and CUDA_DEVICE_MAX_CONNECTIONS=32 (fewer streams sharing a
#                                             hardware queue with the training stream)
#   Round 3 (the hybrid's climber starts at 0, the GPU alone), after 1-4 (SETS=none for 2: no phone set):
#                                          8: DALI installed; ResNet-50 and -18: defaults, GPU decode, DALI's best
#   Final check (the tree as merged), after `gpucheck.sh 1..4` (no datasets):
#                                          9: DALI installed; pytest -m gpu; 512 12-MP photos: where the Loader's
#                                             ~10% under its decoder fed from memory goes (pipelines, checksums)
# Carry per call: K=1 [.carry/p1, .carry/x], K=2 [.carry/p2], K=3,4 [.carry/pK], K=5,6,8,9 [.carry/p5, .carry/x2],
# K=7 [].
set -uo pipefail
K=$1; shift
case $K in
1|3|4) exec bash benchmarks/h200/stage18.sh $K ;;
2) SETS=${SETS-phone} exec bash benchmarks/h200/stage18.sh 2 ;;
esac
source benchmarks/h200/lib.sh  # W, OUT and the carried DALI parts too
case $K in
5)
  install_dali
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/h200/phone_probe.py --images $W/phone-images \
      --data $W/phone-wds --json $OUT/phone-probe.json 2>&1 | quiet | grep -E "^\[phone|Error"
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 benchmarks/h200/profile_step.py --data $W/base-wds \
      --images $W/base-images --consumer resnet50 --rows ceiling,ff,ff-gpu,dali4 --trace-dir /tmp/traces \
      --json $OUT/profile-resnet50.json 2>&1 | quiet | grep -vE "USDT|^ERROR|^\s*$" | tail -24
  t=/tmp/traces/resnet50
  python3 benchmarks/h200/trace_gaps.py $t-ceiling $t-ff $t-ff-gpu $t-dali4 2>&1 | tee $OUT/trace-gaps.txt
  BLOCKERS_JSON=$OUT/blockers.json python3 benchmarks/h200/trace_gaps.py --blockers $t-ff $t-ff-gpu $t-dali4 \
      2>&1 | tee $OUT/blockers.txt
  ;;
6)
  install_dali
  gpu_tests
  CUDA_VISIBLE_DEVICES=0 timeout 420 python3 $T --label phone --data $W/phone-wds --images $W/phone-images \
      --rows default,dali --dali-grid 0.9:4 --steps 12 --warmup 8 --consumers none,resnet50 \
      --extra-ff 'old hw1.0 t2=dict(hw_decoder_load=1.0, num_threads=2);p1=dict(pipelines=1)' \
      --json $OUT/table-phone.json 2>&1 | grep -E "^\[" | quiet
  ;;
7)
  gpu='gpu=dict(decoder="dali");gpu p1 hw0.9 t4=dict(decoder="dali", pipelines=1, hw_decoder_load=0.9, num_threads=4)'
  args="--data $W/base-wds --images $W/base-images --consumers resnet50,resnet18 --steps 150 --warmup 100"
  CUDA_VISIBLE_DEVICES=0 timeout 280 python3 $T $args --rows default,dali --dali-grid 0.9:4 --extra-ff "$gpu" \
      --json $OUT/table-r50.json 2>&1 | grep -E "^\[" | quiet
  CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_VISIBLE_DEVICES=0 timeout 280 python3 $T $args --rows default,dali \
      --dali-grid 0.9:4 --extra-ff "${gpu%%;*}" --json $OUT/table-r50-conn32.json 2>&1 | grep -E "^\[" | quiet
  ;;
8)
  install_dali
  for run in a b; do
    CUDA_VISIBLE_DEVICES=0 timeout 270 python3 $T --data $W/base-wds --images $W/base-images --steps 150 \
        --warmup 100 --consumers resnet50,resnet18 --rows default,dali --dali-grid 0.9:4 \
        --extra-ff 'gpu=dict(decoder="dali")' --json $OUT/table-start0-$run.json 2>&1 | grep -E "^\[" | quiet
  done
  ;;
9)
  install_dali
  gpu_tests
  SETS=phone PHONE_IMAGES=512 bash benchmarks/h200/stage18.sh 2 2>&1 | grep -E "images \(phone\)"
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/h200/phone_probe.py --images $W/phone-images \
      --data $W/phone-wds --num 512 --batches 12 \
      --rows ours-t4,ours-x2-t4,loader,loader-p1,loader-p1-nocheck,dali-file --json $OUT/phone-probe-final.json \
      2>&1 | quiet | grep -E "^\[phone|Error"
  ;;
esac
