#!/usr/bin/env bash
# Issue 14, for the twenty-first session (written 2026-12-02, not yet run): thumbnails on a rank with few cores, as
# on an 8-GPU host (32-64 cores: 4-8 per rank). `auto` decodes thumbnails on the CPU whatever the cores. On 4 cores
# (twentieth session, stage45.sh 7) that read 0.40x DALI alone (10.8k img/s; the GPU decode 37.2k) but trained
# ResNet-50 at 64 px 1.03x DALI (the GPU decode 0.94x). ResNet-18 at 64 px wants ~2x ResNet-50's images: on 4 cores the
# CPU decode may starve it. The question: a rule by cores per rank, or the pipeline tuner's next pipeline decoding on
# the GPU once the CPU ones are at their limit?
#   bash benchmarks/h200/stage47.sh K     K = 1..4: staging as stage31.sh (SETS2 default: thumb; SETS3 default: none)
#                                          5: DALI installed; tests/test_gpu.py unless TESTS=0
#                                          6: thumbnails (64 px) on cores 0-3: alone, beside ResNet-18 and -50: the
#                                             defaults, the GPU decode, DALI's webdataset reader
#                                          7: the same on cores 0-7
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6.. [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "thumb" ""
source benchmarks/h200/lib.sh
tag=${TAG:-a}
few_cores() {  # $1 = the cores (taskset's list), $2 = JSON name
  CORES=$1 tag=$2-$tag thumb_table none,resnet18,resnet50 'gpu=dict(decoder="dali")'
}
case $K in
5) install_dali
   [ "${TESTS:-1}" = 1 ] && gpu_tests ;;
6) few_cores 0-3 cores4 ;;
7) few_cores 0-7 cores8 ;;
esac
