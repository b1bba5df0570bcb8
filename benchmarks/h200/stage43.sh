#!/usr/bin/env bash
# Issue 14, nineteenth session, round 3 (2026-12-02), on one nvidia-h200: does the ~2.5-MP photos' first Loader of a
# process wait ~1 s between its constructor and the first batch (a later Loader 0.3 s, ImageNet-like 0.2 s) because
# DALI's memory pools grow during the first run? first_batch.py --prealloc: the pools grown (1 GiB pinned, 4 GiB
# device) before the constructor, or in a thread beside it, against not at all; each process fresh.
#   bash benchmarks/h200/stage43.sh K     K = 1..4: staging as stage31.sh (SETS2= and SETS3=mid)
#                                          5: DALI installed (TESTS=0)
#                                          6: first batch on the ~2.5-MP photos: none / parallel / before, twice
# Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2, .carry/fw], K=6 [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "" "mid"
source benchmarks/h200/lib.sh
tag=${TAG:-a}
case $K in
5) TESTS=0 install_and_test ;;
6) for i in 1 2; do
     for mode in none parallel before; do
       CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/h200/first_batch.py --data $W/mid-wds --batches 2 \
           --prealloc $mode --json $OUT/first-batch-mid-$mode-$i-$tag.json 2>&1 \
           | grep -E '"(constructor|first_batch|prealloc_done)_s"' | head -3 | tr -d '\n '
       echo " <- $mode $i"
     done
   done ;;
esac
