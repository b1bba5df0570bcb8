#!/usr/bin/env bash
# Issue 14's GPU-host session: calls back to back (the host keeps /tmp only while warm, 30 s after a call).
# Run from the worktree copy (.gpuwt) with the DALI parts in ../.carry/pK:
#   bash benchmarks/h200/stage14.sh K       K = 1..4 bring a DALI part each and prepare data / baselines,
#                                           5 installs DALI and runs the main table, 6 the image regimes
set -uo pipefail
K=$1; shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/dali
cp ../.carry/p$K/part.* /tmp/dali/ 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
W=/tmp/ffbench
T=benchmarks/h200/train_table.py
mk() {  # mk NAME REGIME N [pack]
  local img=$W/$1-images wds=$W/$1-wds
  if [ "$2" = imagenet ]; then python3 tools/make_dataset.py $img --num-images $3 --num-classes 100 --seed 0
  else python3 tools/make_dataset.py $img --regime $2 --num-images $3 --num-classes 100 --seed 0; fi
  [ -e $wds/fastfeed.json ] || python3 -m fastfeed.cli pack $img $wds --format wds --shard-size 256MB --jpeg keep \
      --shuffle-seed 0 --workers 16 --quiet --overwrite
  echo "$1: $(du -sh $img | cut -f1) images, $(du -sh $wds | cut -f1) packed"
}
case $K in
1)
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv; nproc; python3 --version
  which nsys ncu || echo "no nsys on PATH"; ls /opt/nvidia 2>/dev/null
  python3 -c "import torch; print('torch', torch.__version__, 'stream priority range', torch.cuda.Stream.priority_range())"
  python3 setup.py -q build_ext --inplace 2>&1 | grep -iE "error" ; python3 -c "import fastfeed._native as n; print('native ok')"
  time mk base imagenet 20000
  time mk thumb thumb 20000
  ;;
2)
  time mk phone phone 384
  time mk png png 4000
  time mk mixed mixed 4000
  python3 $T --data $W/base-wds --images $W/base-images --rows torch --consumers none,resnet50,resnet18 \
      --json $OUT/torch-imagenet.json 2>&1 | grep -v Warning
  ;;
3)
  python3 $T --label thumb --image-size 64 --data $W/thumb-wds --images $W/thumb-images --rows torch \
      --consumers none,resnet50 --json $OUT/torch-thumb.json 2>&1 | grep -v Warning
  python3 $T --label png --data $W/png-wds --images $W/png-images --rows torch --consumers none,resnet50 \
      --json $OUT/torch-png.json 2>&1 | grep -v Warning
  ;;
4)
  python3 $T --label mixed --data $W/mixed-wds --images $W/mixed-images --rows torch --consumers none,resnet50 \
      --batch-size 128 --steps 24 --warmup 4 --json $OUT/torch-mixed.json 2>&1 | grep -v Warning
  python3 $T --label phone --data $W/phone-wds --images $W/phone-images --rows torch --consumers none,resnet50 \
      --batch-size 64 --steps 16 --warmup 4 --json $OUT/torch-phone.json 2>&1 | grep -v Warning
  ;;
5)
  bash ../.carry/p5/install_dali.sh || exit 1
  python3 $T --data $W/base-wds --images $W/base-images --consumers resnet50,resnet18,none "$@" \
      --json $OUT/table-imagenet.json 2>&1 | grep -v Warning | tee $OUT/table-imagenet.log
  ;;
6)
  G="--ff-grid 1:1.0:2,1:0.9:4,2:0.9:4,3:0.9:4 --dali-grid 0.9:4,1.0:2 --rows default,ff,dali"
  python3 $T --label thumb --image-size 64 --data $W/thumb-wds --images $W/thumb-images $G "$@" \
      --consumers none,resnet50 --json $OUT/regime-thumb.json 2>&1 | grep -v Warning
  python3 $T --label png --data $W/png-wds --images $W/png-images $G "$@" --consumers none,resnet50 \
      --json $OUT/regime-png.json 2>&1 | grep -v Warning
  python3 $T --label mixed --data $W/mixed-wds --images $W/mixed-images $G "$@" --consumers none,resnet50 \
      --batch-size 128 --steps 24 --warmup 4 --json $OUT/regime-mixed.json 2>&1 | grep -v Warning
  python3 $T --label phone --data $W/phone-wds --images $W/phone-images $G "$@" --consumers none,resnet50 \
      --batch-size 64 --steps 16 --warmup 4 --json $OUT/regime-phone.json 2>&1 | grep -v Warning
  ;;
esac
