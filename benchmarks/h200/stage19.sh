#!/usr/bin/env bash
# Issue 14, third session (2026-11-30), round 2 on nvidia-h200-x2, the tree as merged: gpu tests, the 12-MP first
# batch with the lazily faulted and pinned ring, thumbnails with auto's CPU decode, DDP next to DALI's own DDP,
# ImageNet-like training rows.
#   bash benchmarks/h200/stage19.sh K     K = 1..4 staging (stage18.sh's: base, thumbnail and phone sets)
#                                          5: DALI installed; pytest -m gpu; phone first batch and table; thumbnails
#                                          6: DDP rows; ImageNet-like R50/R18 rows
#                                          7: PNG-heavy set (70% PNG): DALI threads from the share the hardware decoder
#                                             cannot take, against the old fixed 2
# Carry per call: K=1 [.carry/p1, .carry/x], K=2 [.carry/p2], K=3,4 [.carry/pK], K=5 [.carry/p5, .carry/x2], K=6,7 [].
set -uo pipefail
K=$1; shift
case $K in 1|2|3|4) exec bash benchmarks/h200/stage18.sh $K ;; esac
source benchmarks/h200/lib.sh  # W, OUT and the carried DALI parts too
case $K in
5)
  install_dali
  gpu_tests
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/h200/first_batch.py --data $W/phone-wds --batches 3 \
      --json $OUT/first-batch-phone.json 2>&1 | quiet | grep -E "ring_|_s\"|images_per_s|arena" | tr -s ' ' | tr '\n' ' '; echo
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 $T --label phone --data $W/phone-wds --images $W/phone-images \
      --rows default,dali --dali-grid 1.0:2,0.9:4 --steps 12 --warmup 4 --consumers none,resnet50 \
      --json $OUT/table-phone.json 2>&1 | grep -E "^\[" | quiet
  CUDA_VISIBLE_DEVICES=0 timeout 330 python3 $T --label thumb --image-size 64 --data $W/thumb-wds \
      --images $W/thumb-images --rows default,dali,torch --dali-grid 0.9:4 --steps 150 --warmup 20 \
      --extra-ff 'gpu-dali=dict(decoder="dali")' --consumers resnet50,none \
      --json $OUT/table-thumb.json 2>&1 | grep -E "^\[" | quiet
  ;;
6)
  ddp one 1
  ddp default 2
  ddp dali-one 1 --loader dali-wds
  ddp dali-two 2 --loader dali-wds
  FASTFEED_DALI_CHROMA=plain ddp plain-two 2
  CUDA_VISIBLE_DEVICES=0 timeout 300 python3 $T --data $W/base-wds --images $W/base-images \
      --rows default,dali --dali-grid 1.0:2 --consumers resnet50,resnet18 --steps 60 --warmup 10 \
      --extra-ff 'no-checksum=dict(verify_checksums=False)' --json $OUT/table-imagenet.json 2>&1 | grep -E "^\[" | quiet
  ;;
7)
  python3 tools/make_dataset.py $W/png-images --regime png --num-images 4000 --num-classes 100 --seed 0 | tail -1
  python3 -m fastfeed.cli pack $W/png-images $W/png-wds --format wds --shard-size 256MB --jpeg keep \
      --shuffle-seed 0 --workers 16 --quiet --overwrite | tail -1
  CUDA_VISIBLE_DEVICES=0 timeout 400 python3 $T --label png --data $W/png-wds --images $W/png-images \
      --rows default,dali,torch --dali-grid 0.9:8 --steps 20 --warmup 4 --consumers none,resnet50 \
      --extra-ff 'threads-2=dict(num_threads=2)' --json $OUT/table-png.json 2>&1 | grep -E "^\[" | quiet
  ;;
esac
