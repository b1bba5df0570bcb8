#!/usr/bin/env bash
# Issue 14, fifth session (2026-11-30), nvidia-h200-x2: where the time to the first batch goes (one GPU and DDP),
# with the decoders after the first built in a background thread (tried, then reverted) against the tree before it
# (ab-old/: HEAD b7b5b07's fastfeed, carried untracked), and the hybrid decoder's response curve (the loop's period
# at each fixed CPU share, step by step) for the climber's design.
#   bash benchmarks/h200/stage21.sh K     K = 1..4 staging (stage18.sh's: base, thumbnail and phone sets)
#                                          5: DALI installed; pytest -m gpu; start-up phases, old vs new tree
#                                          6: the share sweep, ResNet-50 and ResNet-18
#   Round 2 (the climber in steps of 1/8 from 1/8; the chroma mode from the nvJPEG the process loaded), after 1-4:
#                                          7: DALI installed with nvJPEG 13.3 (what pip installs); pytest -m gpu;
#                                             which nvJPEG a process gets; 12-MP photos alone, cropped vs whole
#                                          8: ImageNet-like R50/R18/alone: hybrid new vs old (ab-old), GPU decode, DALI
#                                          9: DDP two GPUs: hybrid new vs old, DALI's reader
# Carry per call: K=1 [.carry/p1, .carry/x], K=2 [.carry/p2], K=3,4 [.carry/pK], K=5,7 [.carry/p5, .carry/x2],
# K=6,8,9 []. ab-old/ (untracked, so it travels; move it aside for K=1, whose carry is near the 64 MiB limit):
#   mkdir ab-old && git archive b7b5b07 fastfeed benchmarks/h200 benchmarks/dali_reference.py | tar -x -C ab-old
#   cp benchmarks/h200/startup.py ab-old/benchmarks/h200/
# As run on 2026-11-30: round 1's tree built the decoders after the first in a background thread (reverted after it),
# round 2's (4ec5be8) chose the cropped GPU decode where the process's nvJPEG allowed it (not kept): on main, step 5
# times the plain constructor and step 7's probe reports the whole-image decode in both orders.
set -uo pipefail
K=$1; shift
case $K in 1|2|3|4) exec bash benchmarks/h200/stage18.sh $K ;; esac
source benchmarks/h200/lib.sh  # W, OUT and the carried DALI parts too
cp /tmp/ffnative/_native*.so ab-old/fastfeed/ 2>/dev/null
startup() {  # $1 = tree (new | old), $2 = decoder, $3 = ranks
  local dir=. py=benchmarks/h200/startup.py
  [ $1 = old ] && dir=ab-old
  if [ $3 = 1 ]; then
    (cd $dir && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=/tmp/site:$PWD timeout 100 python3 $py --data $W/base-wds \
        --decoder $2 --json $OUT/startup-$1-$2-1.json 2>&1 | quiet | grep -E "^\[startup|build|first_run|produce\[0")
  else
    (cd $dir && PYTHONPATH=/tmp/site:$PWD timeout 150 torchrun --standalone --nproc-per-node $3 $py \
        --data $W/base-wds --decoder $2 --json $OUT/startup-$1-$2-$3.json 2>&1 | quiet | grep -E "^\[startup")
  fi
}
case $K in
5)
  install_dali
  gpu_tests
  for dec in dali hybrid; do for tree in old new old new; do startup $tree $dec 1; done; done
  for dec in dali hybrid; do for tree in old new; do startup $tree $dec 2; done; done
  ;;
7)
  install_dali
  python3 -m pip install -q --no-index --no-deps --target /tmp/nvj133 .carry/nvj/nvidia_nvjpeg-13.3*.whl
  cp /tmp/nvj133/nvidia/cu13/lib/libnvjpeg.so.13 /tmp/site/nvidia/cu13/lib/libnvjpeg.so.13
  gpu_tests
  for first in dali torchvision dali torchvision; do
    CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/h200/nvjpeg_probe.py --first $first \
        --data $W/phone-wds --json $OUT/nvjpeg-$first.json 2>&1 | quiet | grep -E "^\[nvjpeg|Error|ROI"
  done
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 $T --label phone --data $W/phone-wds --images $W/phone-images \
      --rows dali --dali-grid 0.9:4 --steps 12 --warmup 4 --consumers none --json $OUT/table-phone.json 2>&1 \
      | grep -E "^\[" | quiet
  ;;
8)
  args="--data $W/base-wds --images $W/base-images --consumers resnet50,resnet18,none --steps 150 --warmup 150"
  CUDA_VISIBLE_DEVICES=0 timeout 330 python3 $T $args --rows default,dali --dali-grid 0.9:4 \
      --extra-ff 'gpu decode=dict(decoder="dali")' --json $OUT/table-imagenet.json 2>&1 | grep -E "^\[" | quiet
  (cd ab-old && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=/tmp/site:$PWD timeout 200 python3 $T $args --rows default \
      --json $OUT/table-imagenet-old.json 2>&1 | grep -E "^\[" | quiet)
  ;;
9)
  ddp hybrid-one 1 --warmup 150 --loader-kwargs '{"decoder": "hybrid"}'
  ddp hybrid-two 2 --warmup 150 --loader-kwargs '{"decoder": "hybrid"}'
  ddp dali-two 2 --warmup 150 --loader dali-wds
  (cd ab-old && OUT=$OUT W=$W PYTHONPATH=/tmp/site:$PWD ddp old-hybrid-two 2 --warmup 150 \
      --loader-kwargs '{"decoder": "hybrid"}')
  ;;
6)
  CUDA_VISIBLE_DEVICES=0 timeout 560 python3 benchmarks/h200/share_sweep.py --data $W/base-wds \
      --consumers resnet50,resnet18 --shares 0.5,0,0.75,0.25,1,0.625,0.125,0.375,0.5 --warmup 30 --steps 100 \
      --json $OUT/share-sweep.json 2>&1 | quiet | grep -E "^==|share"
  ;;
esac
