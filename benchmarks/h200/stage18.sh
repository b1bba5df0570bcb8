#!/usr/bin/env bash
# Issue 14, third session (2026-11-30), round 1 on nvidia-h200-x2: what the 12-MP first batch spends, whether a
# CPU decode (DALI's CPU backend) beats the GPU one on thumbnails in training, and what makes DDP ranks wait.
#   bash benchmarks/h200/stage18.sh K     K = 1..4 staging (stage15.sh's, plus the thumbnail and phone sets in 2)
#                                          5: DALI installed; first batch on phone photos; thumbnails table
#                                          6: DDP: resident-data ceiling and loader variants on 1 and 2 GPUs
# Carry per call: K=1 [.carry/p1, .carry/x], K=2 [.carry/p2] (+ .carry/x2 when the tree allows), K=3,4 [.carry/pK], K=5 [.carry/p5, .carry/x2], K=6 [].
set -uo pipefail
K=$1; shift
W=/tmp/ffbench
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/dali
mk() {  # $1 = name, $2 = regime, $3 = images
  python3 tools/make_dataset.py $W/$1-images --regime $2 --num-images $3 --num-classes 100 --seed 0 | tail -1
  python3 -m fastfeed.cli pack $W/$1-images $W/$1-wds --format wds --shard-size 256MB --jpeg keep \
      --shuffle-seed 0 --workers 16 --quiet --overwrite | tail -1
}
case $K in
1|3|4) exec bash benchmarks/h200/stage15.sh $K ;;
2) bash benchmarks/h200/stage15.sh 2
   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; cp /tmp/ffnative/_native*.so fastfeed/
   ls .carry/x2/*.whl >/dev/null 2>&1 || echo "no .carry/x2 this call"
   for set in ${SETS:-thumb phone}; do  # later rounds ask for fewer: SETS=phone
     case $set in thumb) time mk thumb thumb 20000 ;; phone) time mk phone phone ${PHONE_IMAGES:-1024} ;; esac
   done; exit 0 ;;
esac
source benchmarks/h200/lib.sh  # copies the carried DALI part too
case $K in
5)
  install_dali
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/h200/first_batch.py --data $W/phone-wds --batches 3 \
      --json $OUT/first-batch-phone.json 2>&1 | quiet | tail -40
  CUDA_VISIBLE_DEVICES=0 timeout 330 python3 $T --label thumb --image-size 64 --data $W/thumb-wds \
      --images $W/thumb-images --rows default,dali,torch --dali-grid 0.9:4 --steps 30 --warmup 8 \
      --extra-ff 'cpu-dali t12=dict(decoder="cpu-dali", num_threads=12)' --consumers none,resnet50 \
      --json $OUT/table-thumb.json 2>&1 | grep -E "^\[" | quiet
  ;;
6)
  nvidia-smi topo -m | head -4
  ddp resident1 1 --resident
  ddp resident2 2 --resident
  ddp one 1
  ddp default 2
  OMP_NUM_THREADS=8 ddp omp8 2
  ddp pipelines3 2 --loader-kwargs '{"pipelines": 3}'
  ddp prefetch6 2 --loader-kwargs '{"prefetch": 6}'
  ddp pipelines1 2 --loader-kwargs '{"pipelines": 1}'
  ;;
esac
