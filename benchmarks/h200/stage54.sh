#!/usr/bin/env bash
# Issue 14, twenty-fourth session (2026-12-02), on one nvidia-h200: ResNet-50's median step beside fastfeed is ~1.4%
# longer than beside DALI's file reader (stage53.sh 7: 58.7-58.8 against 57.9 ms), where ResNet-18's are equal.
# fastfeed decodes each whole JPEG on the GPU (interpolated chroma: the decode contract, decode/dali.py chroma_mode)
# and cuts the window in the resize; DALI's reader decodes only the window (ROI, plain chroma). Does decoding the
# window with plain chroma (FASTFEED_DALI_CHROMA=plain: outside the contract, for this measurement only) close it?
#   bash benchmarks/h200/stage54.sh K     K = 1..4: staging as stage31.sh; 5: DALI installed (TESTS=0: no tests)
#                                          6: ResNet-50, three processes: the defaults, chroma=plain in both orders,
#                                             DALI's file reader last in each
# Carry per call as stage53.sh. Each step from 5 packs $OUT into one archive (bundle_out, lib.sh).
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "" ""
source benchmarks/h200/lib.sh
tag=${TAG:-a}
case $K in
5) install_and_test ;;
6) for i in 1 2 3; do
     order=(--rows default,dali-file)  # odd processes: the defaults first; even ones: chroma=plain first
     [ $((i % 2)) = 0 ] && order=(--rows dali-file --extra-ff "ff-default=dict()")
     table $PWD chroma-resnet50-$i-$tag resnet50 --steps 300 --max-warmup 500 --chroma plain "${order[@]}"
   done ;;
esac
[ $K -ge 5 ] && bundle_out stage54-$K-$tag
true
