#!/usr/bin/env bash
# Issue 14, fourth session (2026-11-30), on nvidia-h200-x2: the hybrid decoder (each batch split between DALI's
# CPU backend and the GPU, the split following the training loop's pace: fastfeed/decode/hybrid.py) in training,
# in DDP, on 12-MP photos and on thumbnails, each next to the GPU default and DALI's own readers in the same run.
#   bash benchmarks/h200/stage20.sh K     K = 1..4 staging (stage18.sh's: base, thumbnail and phone sets)
#                                          5: DALI installed; pytest -m gpu; ImageNet-like R50/R18/alone table
#                                          6: DDP on 1 and 2 GPUs: GPU default, hybrid, DALI's reader
#                                          7: 12-MP photos and thumbnails
#   Round 2 (the hybrid's split hill-climbed on the loop's period; cpu-dali for a GPU with 2 pipelines), after 1-4:
#                                          8: DALI installed; pytest -m gpu; ImageNet-like table, 150 warm-up steps
#                                          9: DDP (150 warm-up steps); thumbnails with the new default
# Carry per call: K=1 [.carry/p1, .carry/x], K=2 [.carry/p2], K=3,4 [.carry/pK], K=5,8 [.carry/p5, .carry/x2],
# K=6,7,9 [].
set -uo pipefail
K=$1; shift
case $K in 1|2|3|4) exec bash benchmarks/h200/stage18.sh $K ;; esac
source benchmarks/h200/lib.sh  # W, OUT and the carried DALI parts too
HY='hybrid=dict(decoder="hybrid")'
ddp_rows() {  # the GPU decode, the hybrid and DALI's reader on 1 and 2 GPUs; args go to every row
  ddp one 1 "$@"
  ddp default 2 "$@"
  ddp hybrid-one 1 "$@" --loader-kwargs '{"decoder": "hybrid"}'
  ddp hybrid-two 2 "$@" --loader-kwargs '{"decoder": "hybrid"}'
  ddp dali-one 1 "$@" --loader dali-wds
  ddp dali-two 2 "$@" --loader dali-wds
}
case $K in
5|8)
  install_dali
  gpu_tests
  [ $K = 8 ] && { CUDA_VISIBLE_DEVICES=0 timeout 420 python3 $T --data $W/base-wds --images $W/base-images \
      --rows default,dali --dali-grid 1.0:2,0.9:4 --consumers resnet50,resnet18,none --steps 80 --warmup 150 \
      --extra-ff "$HY" --json $OUT/table-imagenet.json 2>&1 | grep -E "^\[" | quiet; exit 0; }
  CUDA_VISIBLE_DEVICES=0 timeout 330 python3 $T --data $W/base-wds --images $W/base-images \
      --rows default,dali --dali-grid 1.0:2,0.9:4 --consumers resnet50,resnet18,none --steps 60 --warmup 10 \
      --extra-ff "$HY;cpu p2 t8=dict(decoder=\"cpu-dali\", pipelines=2, num_threads=8)" \
      --json $OUT/table-imagenet.json 2>&1 | grep -E "^\[" | quiet
  ;;
6)
  ddp_rows
  ;;
7)
  CUDA_VISIBLE_DEVICES=0 timeout 240 python3 $T --label phone --data $W/phone-wds --images $W/phone-images \
      --rows default,dali --dali-grid 1.0:2,0.9:4 --steps 12 --warmup 4 --consumers none,resnet50 \
      --extra-ff "$HY" --json $OUT/table-phone.json 2>&1 | grep -E "^\[" | quiet
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 $T --label thumb --image-size 64 --data $W/thumb-wds \
      --images $W/thumb-images --rows default,dali,torch --dali-grid 0.9:4 --steps 150 --warmup 20 \
      --extra-ff "$HY;cpu p2=dict(decoder=\"cpu-dali\", pipelines=2)" --consumers resnet50,none \
      --json $OUT/table-thumb.json 2>&1 | grep -E "^\[" | quiet
  ;;
9)
  ddp_rows --warmup 150
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 $T --label thumb --image-size 64 --data $W/thumb-wds \
      --images $W/thumb-images --rows default,dali,torch --dali-grid 0.9:4 --steps 150 --warmup 20 \
      --consumers resnet50,none --json $OUT/table-thumb.json 2>&1 | grep -E "^\[" | quiet
  ;;
esac
