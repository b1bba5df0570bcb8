#!/usr/bin/env bash
# Issue 14, for the twentieth session (written 2026-12-02, not yet run): the GPU tests on the nineteenth session's final
# tree (its last commits ran on the dev box only), and the thumbnails within issue 14's core budget (DALI's cores + 1).
# The defaults (DALI's CPU backend, ~3k img/s a core) beat DALI's reader on 2-3 more cores than it uses; the hybrid
# splits each batch between the CPU backend and the GPU, so capping its CPU threads caps the cores.
#   bash benchmarks/h200/stage44.sh K     K = 1..4: staging as stage31.sh (SETS2 default: thumb; SETS3 default: none)
#                                          5: DALI and Lightning installed; the GPU tests and test_dali_codecs.py
#                                             unless TESTS=0
#                                          6: thumbnails (64 px), alone and beside ResNet-50: the defaults, the hybrid
#                                             with 1, 2 and 3 decode threads, the GPU decode, DALI's webdataset reader
#                                          7: ImageNet-like, ResNet-18 and -50: the defaults and DALI's two readers
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK],
# K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "thumb" ""
source benchmarks/h200/lib.sh
tag=${TAG:-a}
HYB='hyb t1=dict(decoder="hybrid", num_threads=1);hyb t2=dict(decoder="hybrid", num_threads=2)'
HYB+=';hyb t3=dict(decoder="hybrid", num_threads=3)'
case $K in
5) install_and_test
   [ "${TESTS:-1}" = 1 ] && CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -p no:cacheprovider \
       tests/test_dali_codecs.py 2>&1 | tail -1 ;;
6) ROWS=default,dali-wds regime thumb none,resnet50 64 150 30 0.9:4 "$HYB;gpu=dict(decoder=\"dali\")" 480 ;;
7) table $PWD r18-r50-$tag resnet18,resnet50 --max-warmup 500 ;;
esac
