#!/usr/bin/env bash
# Issue 14, twenty-first session, round 2 (2026-12-02), on one nvidia-h200, after stage48.sh:
# - `preallocate` (fastfeed/settings.py): large photos' GPU decoders have nvJPEG preallocate for the table's
#   99th-percentile image. Round 1 measured the largest width and height as the hint (mixed orientations: 4032 x 4032
#   for the 12-MP set); the Loader's own hint is one image's size (4032 x 3024 or 3024 x 4032). Does it shorten the
#   first batch as much, and what device memory does each take?
# - "cpu-dali" on a GPU: past its CPU pipelines the tuner's next one decodes on the GPU (gpu_pipelines_from). Round 1
#   on 4 cores: ResNet-18 at 64 px 9,164 img/s (waiting 36%) against the GPU decode's 14,819 and DALI's 16,589.
#   bash benchmarks/h200/stage49.sh K     K = 1..4: staging as stage31.sh (SETS2 default: thumb; SETS3: mid phone)
#                                          5: DALI installed; tests/test_gpu.py unless TESTS=0
#                                          6: first batch in fresh processes, 12-MP photos: before (--no-preallocate),
#                                             ours, ours, before, the largest width and height; ~2.5-MP photos (two
#                                             Loaders each): before, ours, ours, before
#                                          7: thumbnails (64 px) on cores 0-3: alone, beside ResNet-18 and -50: the
#                                             defaults, the CPU decode alone (two fixed pipelines: the defaults before),
#                                             the GPU decode, DALI's webdataset reader
#                                          8: the same on all 16 cores, without the fixed two
#                                          9: 12-MP photos alone: the defaults and DALI's webdataset reader
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6.. [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "thumb" "mid phone"
source benchmarks/h200/lib.sh
tag=${TAG:-a}
fb() {  # $1 = set, $2 = side (before, ours, bbox), $3 = run number, $4 = Loaders, $5 = batches after the first
  local args=() 
  case $2 in before) args=(--no-preallocate) ;;
             bbox) args=(--decoder-args '{"preallocate_width_hint": "max_w", "preallocate_height_hint": "max_h"}') ;;
  esac
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/h200/first_batch.py --data $W/$1-wds --batches $5 \
      --loaders $4 "${args[@]}" --json $OUT/first-batch-$1-$2-$3-$tag.json 2>&1 \
      | grep -E '"(first_batch_s|images_per_s|device_used_gib)"' | tr -d '\n '
  echo " <- $1 $2 $3"
}
thumbs() {  # $1 = the cores (taskset's list, '' for all), $2 = JSON name, $3 = more --extra-ff rows
  CORES=$1 tag=$2-$tag thumb_table none,resnet18,resnet50 "gpu=dict(decoder=\"dali\")$3"
}
case $K in
5) install_dali
   [ "${TESTS:-1}" = 1 ] && gpu_tests ;;
6) n=0; for side in before ours ours before bbox; do n=$((n + 1)); fb phone $side $n 1 1; done
   n=0; for side in before ours ours before; do n=$((n + 1)); fb mid $side $n 2 4; done ;;
7) thumbs 0-3 cores4 ';cpu2=dict(pipelines=2)' ;;
8) thumbs '' cores16 '' ;;
9) ROWS=default,dali-wds regime phone none 224 16 8 0.9:4 '' 300 ;;
esac
