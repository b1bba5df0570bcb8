#!/usr/bin/env bash
# Issue 14, twenty-first session (2026-12-02), on one nvidia-h200: the large photos' first batch (3.4-4.0 s; target
# 3 s). Between the constructor and the first batch the ~2.5-MP photos spend 1.0-1.5 s in the first run of a pipeline
# (ImageNet-like 0.2 s). Growing DALI's pools up front cost as much (nineteenth session); untried: nvJPEG's own
# preallocation, sized from the dataset's table. Each side is a fresh process (first_batch.py --decoder-args):
#   A  = the defaults; H = preallocate_width_hint / preallocate_height_hint = the largest width and height;
#   P  = device_memory_padding = the largest width x height x 3; HP = both.
#   bash benchmarks/h200/stage48.sh K     K = 1..4: staging as stage31.sh (SETS2 default: thumb; SETS3: mid phone)
#                                          5: DALI installed; tests/test_gpu.py unless TESTS=0
#                                          6: first batch, ~2.5-MP photos: A H P HP HP P H A (two Loaders each);
#                                             12-MP photos and ImageNet-like: A HP HP A (one Loader each)
#                                          7, 8: stage47.sh 6, 7 (thumbnails on 4 and 8 cores)
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6.. [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "thumb" "mid phone"
source benchmarks/h200/lib.sh
tag=${TAG:-a}
H='"preallocate_width_hint": "max_w", "preallocate_height_hint": "max_h"'
P='"device_memory_padding": "max_rgb"'
fb() {  # $1 = set, $2 = side (A H P HP), $3 = run number, $4 = Loaders, $5 = batches after the first (4)
  local args batches=${5:-4}
  case $2 in A) args='{}' ;; H) args="{$H}" ;; P) args="{$P}" ;; HP) args="{$H, $P}" ;; esac
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/h200/first_batch.py --data $W/$1-wds --batches $batches \
      --loaders $4 --decoder-args "$args" --json $OUT/first-batch-$1-$2-$3-$tag.json 2>&1 \
      | grep -E '"(constructor|first_batch|images_per)_s"|"images_per_s"' | tr -d '\n '
  echo " <- $1 $2 $3"
}
case $K in
5) install_dali
   [ "${TESTS:-1}" = 1 ] && gpu_tests ;;
6) n=0; for side in A H P HP HP P H A; do n=$((n + 1)); fb mid $side $n 2; done
   n=0; for side in A HP HP A; do n=$((n + 1)); fb phone $side $n 1 1; done
   n=0; for side in A HP HP A; do n=$((n + 1)); fb base $side $n 1; done ;;
7) bash benchmarks/h200/stage47.sh 6 ;;
8) bash benchmarks/h200/stage47.sh 7 ;;
esac
# 9: the 12-MP photos' first batch alone (step 6's phone rows ran out of batches: two an epoch)
[ $K = 9 ] && { n=0; for side in A HP HP A; do n=$((n + 1)); fb phone $side $n 1 1; done; }
