#!/usr/bin/env bash
# Issue 14 on nvidia-h200-x2 (2026-11-30, second session): profile the step, DDP scaling with today's defaults,
# repeated training rows. Steps 1-4 are stage15.sh's (DALI parts, wheels, native build, 20k images), then:
#   bash benchmarks/h200/stage16.sh 5     install DALI (+ nvJPEG 13.3, what pip installs), gpu tests, profiles
#   bash benchmarks/h200/stage16.sh 6     DDP 1 vs 2 GPUs, training rows twice (fastfeed default vs DALI)
set -uo pipefail
K=$1; shift
case $K in 1|2|3|4) exec bash benchmarks/h200/stage15.sh $K ;; esac
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/dali
cp .carry/p$K/part.* /tmp/dali/ 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # KINDS.md: keep multicast off
W=/tmp/ffbench
cp /tmp/ffnative/_native*.so fastfeed/
quiet() { grep -v -iE "nvjpeg2k|nvtiff|^note:|USDT|DeviceProperties|SyncActivity"; }
case $K in
5)
  bash .carry/p5/install_dali.sh 2>&1 | tail -1 || exit 1
  python3 -m pip install -q --no-index --no-deps --target /tmp/nvj133 .carry/nvj/nvidia_nvjpeg-13.3*.whl
  cp /tmp/nvj133/nvidia/cu13/lib/libnvjpeg.so.13 /tmp/site/nvidia/cu13/lib/libnvjpeg.so.13
  nvidia-smi --query-gpu=index,name --format=csv,noheader
  python3 -c "from fastfeed.decode.dali import chroma_mode as c; print('GPU chroma mode', c(True))"
  timeout 120 python3 tools/odd_corpus_gpu.py 2>&1 | quiet > $OUT/odd-corpus.log; tail -1 $OUT/odd-corpus.log
  grep "over threshold" $OUT/odd-corpus.log | sort | uniq -c | head -5
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py > $OUT/pytest-gpu.log 2>&1
  grep -vE "ROI decode|nvjpeg2k|nvtiff" $OUT/pytest-gpu.log | tail -30
  for c in resnet50 resnet18; do
    CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/h200/profile_step.py --data $W/base-wds \
        --images $W/base-images --consumer $c --steps 10 --json $OUT/profile-$c.json --trace-dir $OUT/traces \
        2>&1 | grep -E "^[a-z]|^    " | quiet
  done
  ls -la $OUT/traces
  ;;
6)
  for n in 1 2; do
    timeout 150 torchrun --standalone --nproc-per-node $n benchmarks/h200/ddp_scaling.py --data $W/base-wds \
        --json $OUT/ddp$n.json 2>&1 | grep -E "^\{|Error|error" | quiet
  done
  for r in 1 2; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 benchmarks/h200/train_table.py --data $W/base-wds \
        --images $W/base-images --consumers resnet50,resnet18 --rows default,dali --dali-grid 1.0:2 \
        --label rep$r --json $OUT/table-rep$r.json 2>&1 | grep -E "^\[" | grep -E "<-|ceiling" | quiet
  done
  ;;
esac
