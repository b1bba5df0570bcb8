#!/usr/bin/env bash
# Issue 14, eighth session (2026-12-01), on one nvidia-h200: the GIL a decode worker takes from the training thread.
# DaliDecoder now feeds one TensorListCPU of views instead of a list (DALI checked the list in Python, sample by
# sample) and copies CPU batches out with torch (GIL released) instead of DALI's copy_to_external (GIL held): see
# benchmarks/bench_decoder_gil.py. Measured against the tree before the change (f0601d2, carried as a tarball and
# run from /tmp/old) on the same host, interleaved.
#   bash benchmarks/h200/stage24.sh K     K = 1..4 staging (stage23.sh's: the 20k ImageNet-like set only)
#                                          5: DALI and Lightning installed; pytest -m gpu (tests/test_gpu.py and the
#                                             Lightning recipe, tests/test_gpu_frameworks.py); the old tree unpacked;
#                                             ResNet-50 step profiles, this tree: ceiling, defaults, GPU decode,
#                                             DALI's reader (100 warm-up steps: the hybrid's climber has settled)
#                                          6: the same profiles for the old tree (defaults, GPU decode); the late
#                                             launches of both read by trace_gaps.py (GIL = "uncovered")
#                                          7: training, ResNet-50 and -18, this tree then the old one (defaults and
#                                             DALI's reader, 100 warm-up + 150 timed steps)
#   Round 2 (after 1-4 again, and 5 with PROFILE=0: tests only):
#                                          8: the loader alone (consumer none), this tree and the old one, ABBA
#                                          9: why fastfeed's step times have a tail DALI's lack (p90 8 ms over the
#                                             median; round 1): every step kept (train_table.py --per-step: wait,
#                                             garbage collections, epoch starts), defaults, GPU decode, prefetch 4,
#                                             one pipeline, DALI's readers; ResNet-50 and -18
#   Round 3 (a training Loader reads on into the next epoch: NOTE in fastfeed/loader.py), after 1-4 and 5 (PROFILE=0):
#                                         10: every step kept, ResNet-18 then -50: defaults, GPU decode, DALI's file
#                                             reader (the epoch starts of round 2 cost fastfeed ~50 ms each)
#   Next (not run yet): is ResNet-18's slower steady state in round 3 the reading on, or the row order? After 1-4 and
#   5 with OLDTREE=ab83204 PROFILE=0 (the tree just before reading on, carried as .carry/old/tree-ab83204.tar.gz):
#                                         11: ResNet-18 first: this tree, then the old one (per step, defaults, GPU
#                                             decode, DALI's file reader)
#                                         12: ResNet-50 first: the old tree, then this one
# Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2, .carry/fw, .carry/old],
# K=6..12 []. (How the parts are split to fit in 64 MiB with the tree: benchmarks/h200/README.md.)
set -uo pipefail
K=$1; shift
case $K in 1|2|3|4) exec bash benchmarks/h200/stage23.sh $K ;; esac  # its staging
source benchmarks/h200/lib.sh
OLD=/tmp/old  # the tree before this session's change, with this tree's native build
prof() {  # $1 = tree, $2 = rows, $3 = tag
  (cd $1 && CUDA_VISIBLE_DEVICES=0 timeout 240 python3 benchmarks/h200/profile_step.py --data $W/base-wds \
      --images $W/base-images --consumer resnet50 --rows $2 --warmup 100 --steps 20 --trace-dir /tmp/traces/$3 \
      --json $OUT/profile-$3.json 2>&1 | quiet | grep -vE "USDT|^ERROR|^\s*$|^ {4}" | tail -8)
}
case $K in
5)
  install_dali
  install_frameworks
  rm -rf $OLD && mkdir -p $OLD && tar -xzf .carry/old/tree-${OLDTREE:-f0601d2}.tar.gz -C $OLD \
      && cp /tmp/ffnative/_native*.so $OLD/fastfeed/ && cp benchmarks/h200/trace_gaps.py /tmp/ \
      && echo "old tree: $(ls $OLD)"
  gpu_tests
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_frameworks.py \
      > $OUT/pytest-gpu-fw.log 2>&1
  tail -2 $OUT/pytest-gpu-fw.log
  [ "${PROFILE:-1}" = 1 ] && prof $PWD ceiling,ff,ff-gpu,dali4 new
  ;;
6)
  prof $OLD ff,ff-gpu old
  t=/tmp/traces
  python3 /tmp/trace_gaps.py $t/new/resnet50-ceiling $t/new/resnet50-ff $t/old/resnet50-ff $t/new/resnet50-ff-gpu \
      $t/old/resnet50-ff-gpu $t/new/resnet50-dali4 2>&1 | tee $OUT/trace-gaps.txt | grep "per step"
  BLOCKERS_JSON=$OUT/blockers.json python3 /tmp/trace_gaps.py --blockers $t/new/resnet50-ff $t/new/resnet50-ff-gpu \
      $t/new/resnet50-dali4 2>&1 | tee $OUT/blockers.txt | head -12
  ;;
7) table $PWD new-a resnet50,resnet18; table $OLD old-a resnet50,resnet18 ;;
8) table $PWD alone-new-a none; table $OLD alone-old-a none; table $OLD alone-old-b none; table $PWD alone-new-b none ;;
10) table $PWD chain resnet18,resnet50 --per-step --rows default,dali-file \
       --extra-ff 'gpu=dict(decoder="dali")' ;;
11|12)
  rows=(--per-step --rows default,dali-file --extra-ff 'gpu=dict(decoder="dali")')
  if [ $K = 11 ]; then
    table $PWD order18-new resnet18,resnet50 "${rows[@]}"; table $OLD order18-old resnet18,resnet50 "${rows[@]}"
  else
    table $OLD order50-old resnet50,resnet18 "${rows[@]}"; table $PWD order50-new resnet50,resnet18 "${rows[@]}"
  fi ;;
9) table $PWD steps resnet50,resnet18 --per-step \
       --extra-ff 'gpu=dict(decoder="dali");prefetch4=dict(prefetch=4);p1=dict(pipelines=1)' ;;
esac
