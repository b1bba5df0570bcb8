#!/usr/bin/env bash
# Issue 14, twentieth session, round 3 (2026-12-02): DALI's CPU backend feeding a GPU (`auto` for thumbnails) now
# has its pipeline count tuned from its two (fastfeed/settings.py). Round 2 (stage45.sh 6) had the loader alone on
# thumbnails at 33.0k img/s on four pipelines (the hybrid at a CPU share of ~1) against 23.3k on the CPU backend's
# fixed two; beside ResNet-50 and -18 the loop does not wait, and the tuner should not add any.
#   bash benchmarks/h200/stage46.sh K     K = 1..4: staging as stage31.sh (SETS2 default: thumb; SETS3 default: none)
#                                          5: DALI installed; tests/test_gpu.py unless TESTS=0
#                                          6: thumbnails (64 px), alone and beside ResNet-50 and -18: the defaults,
#                                             the CPU backend on its fixed two (the old default), DALI's webdataset
#                                             reader
#                                          7: beside ResNet-50 only, the defaults and the fixed two, A B B A
# Ran: 1..5, then 6 with the floor at one (the tuner dropped to one pipeline beside ResNet-50: 8,477 against 8,986
# img/s), then, with the floor at two (the committed tree), TAG=floor2 and TAG=floor2-b 6, and 7.
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2],
# K=6.. [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "thumb" ""
source benchmarks/h200/lib.sh
tag=${TAG:-a}
case $K in
5) install_dali
   [ "${TESTS:-1}" = 1 ] && gpu_tests ;;
6) thumb_table none,resnet50,resnet18 'two=dict(pipelines=2)' ;;
7) CUDA_VISIBLE_DEVICES=0 timeout 200 python3 $T --label thumb --data $W/thumb-wds --images $W/thumb-images \
       --image-size 64 --steps 150 --warmup 30 --max-warmup 400 --consumers resnet50 --rows none \
       --extra-ff 'new=dict();two=dict(pipelines=2);two-b=dict(pipelines=2);new-b=dict()' \
       --json $OUT/table-thumb-r50-abba.json 2>&1 | grep -E "^\[" | quiet | grep -E "img/s|could not|failed|ceiling" ;;
esac
