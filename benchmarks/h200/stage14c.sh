#!/usr/bin/env bash
# Issue 14, round 3 (short, what the remaining device minutes allow): the online tuner with warmed switches.
#   bash benchmarks/h200/stage14c.sh K     K = 1..4 DALI parts (+ build, 20k images), 5 installs and measures
set -uo pipefail
K=$1; shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/dali
cp ../.carry/p$K/part.* /tmp/dali/ 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
W=/tmp/ffbench
if ls /tmp/ffnative/_native*.so >/dev/null 2>&1; then cp /tmp/ffnative/_native*.so fastfeed/
else python3 setup.py -q build_ext --inplace 2>&1 | grep -iE "error"; mkdir -p /tmp/ffnative; cp fastfeed/_native*.so /tmp/ffnative/; fi
case $K in
1)
  python3 tools/make_dataset.py $W/base-images --num-images 20000 --num-classes 100 --seed 0
  python3 -m fastfeed.cli pack $W/base-images $W/base-wds --format wds --shard-size 256MB --jpeg keep \
      --shuffle-seed 0 --workers 16 --quiet --overwrite
  ;;
5)
  bash ../.carry/p5/install_dali.sh >/dev/null || exit 1
  for n in 1 2; do
    timeout 100 torchrun --standalone --nproc-per-node $n benchmarks/h200/ddp_scaling.py --data $W/base-wds \
        --json $OUT/ddp$n.json 2>&1 | grep -E "^\{|Error|error" | grep -v -iE "nvjpeg2k|nvtiff"
  done
  CUDA_VISIBLE_DEVICES=0 timeout 100 python3 benchmarks/h200/train_table.py --data $W/base-wds \
      --images $W/base-images --consumers resnet18 --rows default,ff,dali --long-warmup 60 --ff-grid 2:1.0:2 \
      --dali-grid 1.0:2 --json $OUT/table3-r18.json 2>&1 | grep -E "^\[|^===|^row|^[a-z]" \
      | grep -v -iE "nvjpeg2k|nvtiff|note:"
  ;;
esac
