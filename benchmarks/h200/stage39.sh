#!/usr/bin/env bash
# Issue 14, seventeenth session (2026-12-01), on one nvidia-h200: DaliDecoder's pipelines built, fed and run through
# libdali's C API (fastfeed/decode/dali_capi.py: the GIL released in every call) against DALI's Python binding, which
# held the GIL for each whole build (450-575 ms beside training, stage35.sh) and for its per-batch Python.
#   bash benchmarks/h200/stage39.sh K     K = 1..4: staging as stage32.sh
#                                          5: DALI installed, the tree before (9f616f6, carried as
#                                             .carry/old/tree-9f616f6.tar.gz: `OLD=9f616f6 bash prepare_carry.sh`)
#                                             unpacked with this tree's native build; tests/test_gpu.py unless TESTS=0
#                                          6: build_stall_probe.py beside ResNet-18 and -50: builds through the C API,
#                                             then through the binding (--binding python), one process each
#                                          7: ResNet-18, this tree and the old one ABBA (DALI's readers in the first)
#                                          8: ResNet-50, the same
#                                          9: the loader alone, the same (200 steps, at most 400 warm-up)
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2,
# .carry/old], K=6.. [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4) exec bash benchmarks/h200/stage32.sh $K ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
probe() { stall_probe $1-$2-$tag --model $1 --binding $2; }  # $1 = model, $2 = binding (lib.sh)
case $K in
5) unpack_old .carry/old/tree-9f616f6.tar.gz
   install_dali
   if [ "${TESTS:-1}" = 1 ]; then gpu_tests; fi ;;
6) for m in resnet18 resnet50; do probe $m capi; probe $m python; done ;;
7) abba r18 resnet18 ;;
8) abba r50 resnet50 ;;
9) abba alone none --steps 200 --warmup 50 --max-warmup 400 ;;
esac
