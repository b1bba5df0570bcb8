#!/usr/bin/env bash
# Issue 14, twenty-second session (2026-12-02), on one nvidia-h200:
# - the GPU tests on this session's code (a training Loader now starts its ring at construction) and the twenty-first
#   session's last commits, never run on a device;
# - the first batch with and without the ring's read of epoch 0 during the decoders' build (NOTE [Reading before the
#   first iteration]): 12-MP photos 3.05-3.20 s last session, ~1.8 s of it the constructor, and their first batch is
#   ~1.5 GB read only after it. A = this tree; B = first_batch.py --no-prime (the ring started at the first iteration);
# - then stage50.sh's thumbnail questions (4 cores, then 8).
#   bash benchmarks/h200/stage51.sh K     K = 1..4: staging as stage31.sh (SETS2 default: thumb; SETS3: mid phone)
#                                          5: DALI and Lightning installed; the GPU tests unless TESTS=0
#                                          6: first batch, fresh processes: 12-MP photos B A A B B A A B (one Loader,
#                                             one batch after); ~2.5-MP photos and ImageNet-like B A A B (two Loaders)
#                                          7, 8: stage50.sh 6, 7 (thumbnails on 4 cores, on 8)
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK],
# K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. []. Each step from 5 packs $OUT into one archive (bundle_out, lib.sh).
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "thumb" "mid phone"
source benchmarks/h200/lib.sh
tag=${TAG:-a}
fb() {  # $1 = set, $2 = side (A: this tree; B: --no-prime), $3 = run number, $4 = Loaders, $5 = batches after the first
  local args=""
  [ $2 = B ] && args=--no-prime
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/h200/first_batch.py --data $W/$1-wds --batches ${5:-4} \
      --loaders $4 $args --json $OUT/first-batch-$1-$2-$3-$tag.json 2>&1 \
      | grep -E '"(constructor|first_batch)_s"|"images_per_s"' | tr -d '\n '
  echo " <- $1 $2 $3"
}
case $K in
5) install_and_test ;;
6) n=0; for side in B A A B B A A B; do n=$((n + 1)); fb phone $side $n 1 1; done
   for set in mid base; do n=0; for side in B A A B; do n=$((n + 1)); fb $set $side $n 2; done; done ;;
7) bash benchmarks/h200/stage50.sh 6 ;;
8) bash benchmarks/h200/stage50.sh 7 ;;
esac
[ $K -ge 5 ] && bundle_out stage51-$K-$tag
