#!/usr/bin/env bash
# Issue 14, nineteenth session (2026-12-02), on one nvidia-h200: why a DALI CPU-backend pipeline takes ~1 s to build
# on a GPU host (the thumbnails' decoder pays it per pipeline), the first batch with the package's bytecode compiled
# (as an installed package has it: the carried tree has none, and compiling cost the eighteenth session's first
# Loader 0.49 s), and the 12-MP photos alone (last measured 0.83-0.85x DALI, before the C API and the ring's changes).
#   bash benchmarks/h200/stage41.sh K     K = 1..4: staging as stage31.sh (SETS2= for no thumbnails; SETS3="mid phone")
#                                          5: DALI and Lightning installed; the GPU tests unless TESTS=0
#                                          6: codec_probe.py; first_batch.py twice on the ImageNet-like and the ~2.5-MP
#                                             photos, each in a fresh process, after `compileall`
#                                          7: 12-MP photos alone: the defaults and DALI's webdataset reader (hw 0.9, 4
#                                             threads, its best in the sixth session)
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK],
# K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "thumb" ""
source benchmarks/h200/lib.sh
tag=${TAG:-a}
case $K in
5) install_and_test ;;
6) CUDA_VISIBLE_DEVICES=0 timeout 300 python3 benchmarks/h200/codec_probe.py --json $OUT/codec-probe-$tag.json \
       2>&1 | grep -E "^\["
   python3 -m compileall -q fastfeed
   for set in base mid; do
     for i in 1 2; do
       CUDA_VISIBLE_DEVICES=0 timeout 120 python3 benchmarks/h200/first_batch.py --data $W/$set-wds --batches 4 \
           --json $OUT/first-batch-$set-$i-$tag.json 2>&1 | grep -E '"(constructor|first_batch)_s"' | tr -d '\n '
       echo " <- $set $i"
     done
   done ;;
7) ROWS=default,dali-wds regime phone none 224 16 8 0.9:4 '' 300 ;;
esac
