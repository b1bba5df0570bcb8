#!/usr/bin/env bash
# Issue 14, ninth session (2026-12-01), on one nvidia-h200: the pipeline tuner (fastfeed/pipelines.py). A GPU Loader
# whose `pipelines` is not given starts with 2 and adds one while the loop waits for data and each one pays. Measured
# against the same tree with `pipelines=2` given (the count before the tuner), in the same process.
#   bash benchmarks/h200/stage25.sh K     K = 1..4 staging (stage23.sh's: the 20k ImageNet-like set only)
#                                          5: DALI and Lightning installed; pytest -m gpu (tests/test_gpu.py, with
#                                             the tuner's own test, and tests/test_gpu_frameworks.py)
#                                          6: the loader alone (consumer none): defaults (tuned), pipelines=2, DALI's
#                                             two readers; 200 warm-up + 200 timed steps, every step kept
#                                          7: ResNet-50 and -18 training: defaults, pipelines=2, DALI's file reader
#                                             (the tuner must leave a loop that barely waits alone)
#                                          8: 6 and 7 again (rows in the same order: train_table.py runs them in
#                                             its own; the noise between two runs of a row has been 2-4%)
# Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4) exec bash benchmarks/h200/stage23.sh $K ;;  # staging
5) exec env PROFILE=0 bash benchmarks/h200/stage24.sh 5 ;;  # install, GPU tests (no old tree: tar says so)
esac
source benchmarks/h200/lib.sh
fixed='fixed2=dict(pipelines=2)'
alone() { table $PWD alone-$1 none --per-step --warmup 200 --steps 200 --rows $2 --extra-ff "$fixed"; }
train() { table $PWD train-$1 resnet50,resnet18 --per-step --rows $2 --extra-ff "$fixed"; }
case $K in
6) alone a default,dali ;;
7) train a default,dali-file ;;
8) alone b default,dali; train b default,dali-file ;;
esac
