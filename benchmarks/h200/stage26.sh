#!/usr/bin/env bash
# Issue 14, tenth session (2026-12-01), on one nvidia-h200: the pipeline tuner goes below its start (to one pipeline
# while the loop barely waits and one is not slower: ResNet-50) and tries a third at a smaller wait (GROW_WAIT 20% ->
# 5%: ResNet-18). Round 1 (`a`) measured that; round 2 (`c`, `d`) the same rows after the tuner and the hybrid's
# climber were made to take turns (fastfeed/pace.py: one try at a time, no measurement across the other's change)
# and the climber's hold doubles after each look that finds nothing better. Against fixed counts in the same
# process; `pipelines=2` is what the previous tuner ran in both trainings.
#   bash benchmarks/h200/stage26.sh K     K = 1..5 stage25.sh's: 1..4 staging (the 20k ImageNet-like set only),
#                                          5: DALI and Lightning installed; pytest -m gpu (test_gpu.py, frameworks)
#                                          6: ResNet-50: defaults (tuned), pipelines=1, pipelines=2, DALI's file reader
#                                          7: ResNet-18: defaults (tuned), pipelines=2, pipelines=3, DALI's file reader
#                                          8: the loader alone: defaults (tuned), pipelines=2, DALI's two readers
#                                          9: 6 and 7 again (TAG names the JSON, STEPS the timed steps)
# 150 warm-up + 300 timed steps per training row (the tuner decides within the warm-up: its first try ends ~85
# batches in), every step kept (--per-step).
# Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4|5) exec bash benchmarks/h200/stage25.sh $K ;;  # staging, install, GPU tests: as in the ninth session
esac
source benchmarks/h200/lib.sh
long="--per-step --warmup 150 --steps ${STEPS:-300}"
r50() { table $PWD r50-$1 resnet50 $long --rows default,dali-file --extra-ff 'p1=dict(pipelines=1);fixed2=dict(pipelines=2)'; }
r18() { table $PWD r18-$1 resnet18 $long --rows default,dali-file --extra-ff 'fixed2=dict(pipelines=2);p3=dict(pipelines=3)'; }
case $K in
6) r50 a ;;
7) r18 a ;;
8) table $PWD alone none --per-step --warmup 200 --steps 200 --rows default,dali --extra-ff 'fixed2=dict(pipelines=2)' ;;
9) r50 ${TAG:-b}; r18 ${TAG:-b} ;;
esac
