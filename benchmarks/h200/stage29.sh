#!/usr/bin/env bash
# Issue 14, twelfth session (2026-12-01), on one nvidia-h200: the samples handed to DALI as page-locked, and the
# pipeline tuner that tries the next pipeline at once while the loop still waits.
# DALI's decoders copy every batch whose memory is not marked page-locked into a page-locked buffer of their own
# (NVIDIA/DALI#5003); fastfeed's ring slots are page-locked but were handed over unmarked, so each batch was copied
# once more (30 MB per batch of ImageNet-like photos, ~1.5 GB of 12-MP ones). Rows: the defaults (not marked),
# `_pinned=True` (marked; each batch then waits until DALI has read it before its slot goes back: what ships if it
# pays), `_pinned="async"` (marked, no wait: unsafe, the upper bound), DALI's readers.
#   bash benchmarks/h200/stage29.sh K     K = 1..4 staging (stage18.sh's: the ImageNet-like set, and 512 12-MP
#                                          photos in 2)
#                                          5: DALI and Lightning installed; pytest -m gpu unless TESTS=0
#                                          6: the loader alone (200 + 200 steps; also `_first=2`: the tuned Loader
#                                             started with two pipelines), then ResNet-50 (150 + 300 steps)
#                                          7: 12-MP photos, the loader alone and ResNet-50 (8 + 12 steps)
#                                          8: `fastfeed bench` (none, resnet50) on the final tree; ResNet-18
# Round 2 (decode/dali.py's PINNED_INPUT on for every dataset in that tree, since settings.pinned_input: large
# photos only; no measurement across a new pipeline's build, pace.building): the defaults against
# `_pinned=False` (the old input path), after 1..4 and 5 (the GPU tests):
#                                          9: the loader alone (also `_first=2`), ResNet-18, ResNet-50
#                                         10: 12-MP photos (alone, ResNet-50); `fastfeed bench` (none, resnet50)
# Round 3 (settings.pinned_input: large photos only), after 1..4 (K=11 carries [.carry/p5, .carry/x2]):
#                                         11: DALI installed; tests/test_gpu.py; 12-MP photos alone, the defaults
#                                             against `_pinned=False`
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK],
# K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. [].
set -uo pipefail
K=$1; shift
case $K in
1|3|4) exec bash benchmarks/h200/stage18.sh $K ;;
2) SETS=phone PHONE_IMAGES=${PHONE_IMAGES:-512} exec bash benchmarks/h200/stage18.sh 2 ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
pin='pin=dict(_pinned=True);pin-async=dict(_pinned="async")'
long="--per-step --warmup 150 --steps ${STEPS:-300} --rows dali-file"
phone() {  # the 12-MP photos, 8 + 12 steps: $1 = consumers, $2 = --rows, $3 = --extra-ff, $4 = time limit (s)
  CUDA_VISIBLE_DEVICES=0 timeout $4 python3 $T --label phone --data $W/phone-wds --images $W/phone-images \
      --steps 12 --warmup 8 --consumers $1 --rows $2 --dali-grid 0.9:4 --extra-ff "$3" \
      --json $OUT/table-phone-$tag.json 2>&1 | grep -E "^\[" | quiet | grep -E "img/s|could not|failed" | tail -14
}
case $K in
5) install_and_test ;;
6) table $PWD alone-$tag none --per-step --warmup 200 --steps 200 --rows dali \
       --extra-ff "dflt=dict();first2=dict(_first=2);$pin"
   table $PWD r50-$tag resnet50 $long --extra-ff "dflt=dict();$pin" ;;
7) phone none,resnet50 default,dali-file "$pin" 400 ;;
8) bench_rows none resnet50
   table $PWD r18-$tag resnet18 $long --extra-ff "dflt=dict();pin=dict(_pinned=True)" ;;
9) table $PWD alone-$tag none --per-step --warmup 200 --steps 200 --rows dali \
       --extra-ff "dflt=dict();nopin=dict(_pinned=False);first2=dict(_first=2)"
   table $PWD r18-$tag resnet18 $long --extra-ff "dflt=dict();nopin=dict(_pinned=False)"
   table $PWD r50-$tag resnet50 $long --extra-ff "dflt=dict();nopin=dict(_pinned=False)" ;;
10) phone none,resnet50 default,dali-file "nopin=dict(_pinned=False)" 400
    bench_rows none resnet50 ;;
11) install_dali
    gpu_tests
    phone none default "nopin=dict(_pinned=False)" 150 ;;
esac
