#!/usr/bin/env bash
# Issue 14, thirteenth session (2026-12-01), on one nvidia-h200: every image regime against DALI's readers and the
# DataLoader on the tree as it is (the mixed set and photos of 1.5-3 MP had no fastfeed row yet), and why DALI reading
# the ring in place slowed ResNet-18's step (twelfth session: 28.5 against 24.0 ms p50).
#   bash benchmarks/h200/stage30.sh K     K = 1..4: staging (stage15.sh's: DALI's parts, the native build, the
#                                                    ImageNet-like set in 1)
#                                          2: also the sets in SETS2 (default: thumb png; 20k thumbnails, 4k 70% PNG)
#                                          3: also the sets in SETS3 (default: mixed mid; 4k mixed sizes + 15% PNG, 2k
#                                             photos of 1.9-3.4 MP)
#                                          5: DALI and Lightning installed; the GPU tests unless TESTS=0
#                                          9: ResNet-18 with the ring read in place: the wait spinning / on a blocking
#                                             event / none (unsafe), then torch.profiler timelines of the step, read by
#                                             trace_gaps.py
#                                          6: thumbnails (64 px crops), the loader alone and ResNet-50
#                                          7: photos of 1.9-3.4 MP, the loader alone and ResNet-50
#                                          8: mixed sizes + 15% PNG, and 70% PNG: the loader alone and ResNet-50
# Round 1 ran 1..4, TESTS=0 5 with 9 in the same call, 6 and 7 in one call. Round 2 (settings: photos of 1 MP or more
# get hw_decoder_load 0.9 and 4 threads), after 1, SETS2=mixed 2, SETS3=mid 3, 4, TESTS=0 5:
#                                         10: photos of 1.9-3.4 MP beside ResNet-50, the defaults against the old
#                                             setting (hw 1.0, 2 threads); mixed sizes, alone and beside ResNet-50
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK],
# K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
case $K in
1|4) exec bash benchmarks/h200/stage15.sh $K ;;
2) stage_with_sets 2 "${SETS2-thumb png}"; exit 0 ;;
3) stage_with_sets 3 "${SETS3-mixed mid}"; exit 0 ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
prof() {  # ResNet-18, rows $1: torch.profiler timelines, then what trace_gaps.py reads in them
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/h200/profile_step.py --data $W/base-wds \
      --images $W/base-images --consumer resnet18 --rows $1 --warmup 100 --steps 20 --trace-dir /tmp/traces \
      --json $OUT/profile-r18-$tag.json 2>&1 | quiet | grep -vE "USDT|^ERROR|^\s*$|^ {4}" | tail -6
  local t=/tmp/traces/resnet18
  python3 benchmarks/h200/trace_gaps.py $t-ceiling $t-ff $t-ff-pin 2>&1 | tee $OUT/trace-gaps-$tag.txt \
      | grep "per step"
  BLOCKERS_JSON=$OUT/blockers-$tag.json python3 benchmarks/h200/trace_gaps.py --blockers $t-ff $t-ff-pin 2>&1 \
      | tee $OUT/blockers-$tag.txt | head -16
}
case $K in
5) install_and_test ;;
9) table $PWD r18-$tag resnet18 --per-step --warmup 150 --steps 300 --rows dali-file \
       --extra-ff 'dflt=dict();pin=dict(_pinned=True);pin-event=dict(_pinned="event");pin-async=dict(_pinned="async")'
   prof ceiling,ff,ff-pin ;;
6) regime thumb none,resnet50 64 150 30 0.9:4 'gpu=dict(decoder="dali");pil=dict(decoder="cpu-pil")' 420 ;;
7) regime mid none,resnet50 224 40 10 0.9:4,1.0:2 \
       'hw09t4=dict(hw_decoder_load=0.9, num_threads=4);pin=dict(_pinned=True)' 480 ;;
8) regime mixed none,resnet50 224 40 10 0.9:4 'gpu=dict(decoder="dali")' 280
   regime png none,resnet50 224 40 10 0.9:8 '' 280 ;;
10) ROWS=default regime mid resnet50 224 40 10 0.9:4 'hw1.0 t2=dict(hw_decoder_load=1.0, num_threads=2)' 150
    ROWS=default,dali-wds,torch regime mixed none,resnet50 224 40 10 0.9:4 '' 300 ;;
esac
