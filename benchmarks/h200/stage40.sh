#!/usr/bin/env bash
# Issue 14, eighteenth session (2026-12-01), on one nvidia-h200: the GPU tests on the tree with the pipeline lifetime
# fix (8f93ac4, never run on a GPU), the loader alone on ImageNet-like photos with part of the JPEGs on DALI's CUDA
# decoder (hw_decoder_load 0.9: DALI's own reader is fastest alone so, 1.0 trains fastest), and the thumbnails, whose
# `auto` decoder (DALI's CPU backend) now runs through the C API, against DALI's readers and the DataLoader.
#   bash benchmarks/h200/stage40.sh K     K = 1..4: staging as stage31.sh (2: the thumbnails; 3: SETS3, none unless
#                                                    given, e.g. SETS3=mid for photos of 1.9-3.4 MP)
#                                          5: DALI and Lightning installed; tests/test_gpu.py and test_gpu_frameworks.py
#                                             unless TESTS=0
#                                          6: the loader alone, ImageNet-like: the defaults, hw09 (the hybrid's GPU
#                                             part at hw_decoder_load 0.9), dali94 (GPU decode only, 0.9, 4 threads),
#                                             both orders, each after its tuners settled; DALI's webdataset reader
#                                          7: thumbnails (64 px crops), alone and beside ResNet-50: the defaults, the
#                                             GPU decode, DALI's two readers, the DataLoader
#                                          8: ResNet-18 and -50 on ImageNet-like photos: the defaults and hw09, DALI's
#                                             two readers
#                                          9: photos of 1.9-3.4 MP (SETS3=mid in 3), alone and beside ResNet-50: the
#                                             defaults and DALI's webdataset reader
# Round 2 (a fresh host: SETS2= in 2, TESTS=0 in 5), after the dev box found DALI's CPU decoder segfaulting on a
# damaged JPEG header and the Loader began holding such unchecked JPEGs back (epoch.py `_untrusted`):
#                                         10: tests/test_gpu.py, then dali_probe.py: builds alone / beside a live
#                                             pipeline, and the GPU decoder on four kinds of damage
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK],
# K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "thumb" ""
source benchmarks/h200/lib.sh
tag=${TAG:-a}
B='hw09=dict(hw_decoder_load=0.9)' C='dali94=dict(decoder="dali", hw_decoder_load=0.9, num_threads=4)'
case $K in
5) install_and_test ;;
6) both_orders alone none default,dali-wds --steps 200 --warmup 50 --max-warmup 400 ;;
7) regime thumb none,resnet50 64 150 30 0.9:4 'gpu=dict(decoder="dali")' 420 ;;
8) table $PWD r18-$tag resnet18 --max-warmup 500 --extra-ff "$B"
   table $PWD r50-$tag resnet50 --max-warmup 500 --extra-ff "$B" ;;
9) ROWS=default,dali-wds regime mid none,resnet50 224 40 10 0.9:4 '' 300 ;;
10) gpu_tests
    CUDA_VISIBLE_DEVICES=0 timeout 300 python3 benchmarks/h200/dali_probe.py --images $W/base-images \
        --json $OUT/dali-probe-$tag.json 2>&1 | grep -E "^\[" ;;
esac
