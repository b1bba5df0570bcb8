#!/usr/bin/env bash
# Final check of the session (2026-11-30, nvidia-h200-x2): issue 13's corpus and gpu tests on the final tree, and
# what makes a DDP rank's loader wait every other step (stage16's finding). Steps 1-4 are stage15.sh's; then
#   bash benchmarks/h200/stage17.sh 5
set -uo pipefail
K=$1; shift
case $K in 1|2|3|4) exec bash benchmarks/h200/stage15.sh $K ;; esac
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/dali
cp .carry/p$K/part.* /tmp/dali/ 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # KINDS.md: keep multicast off
W=/tmp/ffbench
cp /tmp/ffnative/_native*.so fastfeed/  # built by step 1 from this same tree
quiet() { grep -v -iE "nvjpeg2k|nvtiff|^note:"; }
ddp() {  # $1 = label, $2 = ranks, rest = extra args
  local label=$1 n=$2; shift 2
  timeout 100 torchrun --standalone --nproc-per-node $n benchmarks/h200/ddp_scaling.py --data $W/base-wds \
      --json $OUT/ddp-$label.json "$@" >/dev/null 2>&1
  python3 -c "import json,sys; d=json.load(open('$OUT/ddp-$label.json')); print('$label', round(d['images_per_s']), 'img/s, wait', [round(w,3) for w in d['wait_fraction_per_rank']], 'settings', d['settings_rank0'])" 2>&1 | tail -1
}
bash .carry/p5/install_dali.sh 2>&1 | tail -1 || exit 1
timeout 120 python3 tools/odd_corpus_gpu.py 2>&1 | quiet > $OUT/odd-corpus.log; tail -1 $OUT/odd-corpus.log
grep "over threshold" $OUT/odd-corpus.log | sort | uniq -c | head -5
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py > $OUT/pytest-gpu.log 2>&1; tail -1 $OUT/pytest-gpu.log
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "one GPU: no DDP rows"; exit 0; }
ddp one 1
ddp default 2
OMP_NUM_THREADS=8 ddp omp8 2
ddp pipelines3 2 --loader-kwargs '{"pipelines": 3}'
ddp prefetch6 2 --loader-kwargs '{"prefetch": 6}'
ddp one-pipelines3 1 --loader-kwargs '{"pipelines": 3}'
