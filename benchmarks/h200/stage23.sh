#!/usr/bin/env bash
# Issue 14, seventh session (2026-12-01), on nvidia-h200-x2: what a Lightning user with two GPUs gets by default, and
# DDP scaling with the climber that starts on the GPU, beside DALI's reader, with and without binding each rank to
# its GPU's NUMA node.
#   bash benchmarks/h200/stage23.sh K     K = 1..4 staging (stage18.sh's, SETS=none: the 20k ImageNet-like set only)
#                                          5: DALI and Lightning installed; pytest -m gpu: tests/test_gpu.py on GPU 0,
#                                             tests/test_gpu_frameworks.py on both GPUs (Lightning, DDP over NCCL)
#                                          6: DDP rows: fastfeed defaults and DALI's reader on 1 and 2 GPUs, the same
#                                             two on 2 GPUs with each rank bound to its node (ddp_scaling.py --bind)
#   Round 2 (step 6 ran lib.sh's ddp rows at 30 warm-up steps: the climber was still tuning when timing began),
#   after 1-4 and 5 (K=5 with SKIP_TESTS=1 only installs):
#                                          7: ResNet-50, 2 GPUs, 150 warm-up + 100 timed steps: the climber from 0
#                                             (twice) and from 1/8, fixed CPU shares 0 / 1/4 / 1/2, DALI's reader;
#                                             fastfeed and DALI on 1 GPU
#   Round 3 (a rank of a DDP job starts the climber at 1/4: settings.py), after 1-4 and 5 (SKIP_TESTS=1):
#                                          8: 2 GPUs, 150 warm-up + 100 timed steps: ResNet-50 and -18 with the new
#                                             default, the climber from 0 (the previous default), DALI's reader;
#                                             ResNet-18 also at fixed shares 0 and 1/4
#                                          9: right after 8 on the same host: ResNet-50 from 0 (step 8's rows from 0
#                                             had failed: torchrun read --start as an abbreviation of its own
#                                             --start-method; the option is now --start-share), the new default, 1 GPU
# A call returns at most 8 files: the JSON of step 6's rows one/default and step 7's r2-fixed*/r2-one did not come
# back; RESULTS.md quotes their printed lines.
# Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2, .carry/fw], K=6..9 [].
# .carry/fw: lightning 2.6.6, lightning-utilities, torchmetrics, tqdm, packaging, typing_extensions (py3 wheels).
set -uo pipefail
K=$1; shift
case $K in
1|3|4) exec bash benchmarks/h200/stage18.sh $K ;;
2) SETS=none exec bash benchmarks/h200/stage18.sh 2 ;;
esac
source benchmarks/h200/lib.sh
case $K in
5)
  install_dali
  install_frameworks
  nvidia-smi topo -m | head -4; lscpu | grep -iE "^NUMA|^CPU\(s\)|Socket"
  [ -n "${SKIP_TESTS:-}" ] && exit 0
  gpu_tests
  timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_frameworks.py > $OUT/pytest-gpu-fw.log 2>&1
  tail -15 $OUT/pytest-gpu-fw.log
  ;;
6)
  ddp one 1
  ddp default 2
  ddp dali1 1 --loader dali-wds --dali-grid 1.0:4
  ddp dali2 2 --loader dali-wds --dali-grid 1.0:4
  # Bound to 16 cores, a rank would budget 8 (cpus // LOCAL_WORLD_SIZE): give it the 6 CPU threads per pipeline
  # it has unbound, so that only the binding differs.
  ddp bind 2 --bind --loader-kwargs '{"num_threads": 6}'
  ddp dali2-bind 2 --bind --loader dali-wds --dali-grid 1.0:4
  ;;
7)
  long="--warmup 150 --steps 100"
  ddp r2-default 2 $long
  ddp r2-fixed25 2 $long --share 0.25
  ddp r2-dali2 2 $long --loader dali-wds --dali-grid 1.0:4
  ddp r2-start125 2 $long --start-share 0.125
  ddp r2-fixed50 2 $long --share 0.5
  ddp r2-fixed0 2 $long --share 0
  ddp r2-default-b 2 $long
  ddp r2-one 1 $long
  ddp r2-dali1 1 $long --loader dali-wds --dali-grid 1.0:4
  ;;
8)
  long="--warmup 150 --steps 100"
  for arch in resnet50 resnet18; do
    a="$long --arch $arch"
    ddp r3-$arch-default 2 $a
    ddp r3-$arch-start0 2 $a --start-share 0
    ddp r3-$arch-dali2 2 $a --loader dali-wds --dali-grid 1.0:4
    ddp r3-$arch-default-b 2 $a
  done
  ddp r3-resnet18-fixed0 2 $long --arch resnet18 --share 0
  ddp r3-resnet18-fixed25 2 $long --arch resnet18 --share 0.25
  ;;
9)
  long="--warmup 150 --steps 100"
  ddp r4-r50-start0 2 $long --start-share 0
  ddp r4-r50-default 2 $long
  ddp r4-r50-one 1 $long
  ;;
esac
