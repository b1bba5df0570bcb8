#!/usr/bin/env bash
# Issue 14, second round (after the changes): on nvidia-h200-x2, calls back to back, run from .gpuwt:
#   bash benchmarks/h200/stage14b.sh K      K = 1..4 bring a DALI part each (1 builds + makes the data),
#                                           5 installs DALI, re-runs the table on GPU 0 and the DDP scaling,
#                                           6 H-decode's odd corpus on the GPU (../.gpudec) and thumbnails
set -uo pipefail
K=$1; shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/dali
cp ../.carry/p$K/part.* /tmp/dali/ 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
W=/tmp/ffbench
T=benchmarks/h200/train_table.py
# the carried tree replaces .gpuwt at every call: keep the native build in /tmp and put it back
if ls /tmp/ffnative/_native*.so >/dev/null 2>&1; then cp /tmp/ffnative/_native*.so fastfeed/
else python3 setup.py -q build_ext --inplace 2>&1 | grep -iE "error"; mkdir -p /tmp/ffnative; cp fastfeed/_native*.so /tmp/ffnative/; fi
case $K in
1)
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; env | grep -E "NCCL|MULTICAST|NVLS"
  python3 tools/make_dataset.py $W/base-images --num-images 20000 --num-classes 100 --seed 0
  python3 -m fastfeed.cli pack $W/base-images $W/base-wds --format wds --shard-size 256MB --jpeg keep \
      --shuffle-seed 0 --workers 16 --quiet --overwrite
  ;;
2)
  python3 tools/make_dataset.py $W/thumb-images --regime thumb --num-images 20000 --num-classes 100 --seed 0
  python3 -m fastfeed.cli pack $W/thumb-images $W/thumb-wds --format wds --shard-size 256MB --jpeg keep \
      --shuffle-seed 0 --workers 16 --quiet --overwrite
  ;;
3|4) ;;
5)
  bash ../.carry/p5/install_dali.sh || exit 1
  CUDA_VISIBLE_DEVICES=0 python3 $T --data $W/base-wds --images $W/base-images --consumers resnet50,resnet18,none \
      --rows default,ff,dali --long-warmup 60 --ff-grid 3:0.9:4,1:0.9:4,2:1.0:2 --switch-grid 1:0.9:4,2:1.0:2 \
      --dali-grid 0.9:6,1.0:2 "$@" --json $OUT/table2-imagenet.json 2>&1 | grep -E "^\[|^===|^row|^[a-z]" \
      | grep -v -iE "nvjpeg2k|nvtiff|note:" | tee $OUT/table2-imagenet.log
  for n in 1 2; do
    timeout 150 torchrun --standalone --nproc-per-node $n benchmarks/h200/ddp_scaling.py --data $W/base-wds \
        --json $OUT/ddp$n.json 2>&1 | grep -E "^\{|Error|error" | grep -v -iE "nvjpeg2k|nvtiff"
  done
  ;;
6)
  (cd ../.gpudec && python3 setup.py -q build_ext --inplace 2>&1 | grep -iE "error";
   PYTHONPATH=/tmp/site:$PWD timeout 200 python3 tools/odd_corpus_gpu.py 2>&1 | grep -v -iE "nvjpeg2k|nvtiff|note:" \
       | tee $OUT/odd_corpus_gpu.log | tail -25)
  CUDA_VISIBLE_DEVICES=0 python3 $T --label thumb --image-size 64 --data $W/thumb-wds --images $W/thumb-images \
      --rows default,dali --dali-grid 0.9:4 --extra-ff "cpu8=dict(decoder='cpu',num_threads=8)" \
      --consumers resnet50,none --json $OUT/table2-thumb.json 2>&1 | grep -E "^\[|^===|^row|^[a-z]" \
      | grep -v -iE "nvjpeg2k|nvtiff|note:"
  ;;
esac
