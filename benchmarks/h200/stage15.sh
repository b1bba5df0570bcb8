#!/usr/bin/env bash
# Issue 13's GPU check and the chroma-upsampling cost in training (2026-11-30, second session), one step per call:
#   bash benchmarks/h200/stage15.sh K      K = 1..4: DALI part K (1 also: xxhash, native build, 20k images; 2: other wheels)
#                                           5: install DALI, nvJPEG 13.0 (the carry's): corpus + training table
#                                           6: nvJPEG 13.3 swapped in: corpus + training table + pytest -m gpu
# (This round's code chose a cropped decode with nvJPEG >= 13.3 ("roi"); the default is now "full" on the GPU.)
# Carry per call: K=1 [.carry/p1, .carry/x], K=2 [.carry/p2, .carry/x2], K=3..5 [.carry/pK]. /tmp survives only while the host stays warm.
set -uo pipefail
K=$1; shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/dali
cp .carry/p$K/part.* /tmp/dali/ 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
W=/tmp/ffbench
# The carried tree replaces the build output at every call: keep the extension in /tmp.
if ls /tmp/ffnative/_native*.so >/dev/null 2>&1; then cp /tmp/ffnative/_native*.so fastfeed/
else python3 setup.py -q build_ext --inplace 2>&1 | grep -iE "error"; mkdir -p /tmp/ffnative; cp fastfeed/_native*.so /tmp/ffnative/; fi
quiet() { grep -v -iE "nvjpeg2k|nvtiff|^note:"; }
table() {  # $1 = label
  timeout 280 python3 benchmarks/h200/train_table.py --data $W/base-wds --images $W/base-images \
      --consumers none,resnet50,resnet18 --rows "$2" --dali-grid 1.0:2 --chroma "$3" --steps 40 --warmup 8 \
      --label "$1" --json $OUT/table-$1.json 2>&1 | grep -E "^\[|^===|^row|^[a-z]" | quiet
}
versions() {
  python3 -c "from fastfeed.decode.dali import chroma_mode as c; print('auto chroma', c(True))"
}
case $K in
1)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 --version
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/x/*.whl
  python3 -c "import fastfeed._native as n; print('native ok, libjpeg', n.HAVE_LIBJPEG)"
  python3 tools/make_dataset.py $W/base-images --num-images 20000 --num-classes 100 --seed 0 | tail -1
  python3 -m fastfeed.cli pack $W/base-images $W/base-wds --format wds --shard-size 256MB --jpeg keep \
      --shuffle-seed 0 --workers 16 --quiet --overwrite | tail -2
  ;;
2)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/x2/*.whl
  ;;
5)
  bash .carry/p5/install_dali.sh 2>&1 | tail -1 || exit 1
  versions
  timeout 120 python3 tools/odd_corpus_gpu.py 2>&1 | quiet > $OUT/odd-corpus-nvjpeg130.log; tail -2 $OUT/odd-corpus-nvjpeg130.log
  grep "over threshold" $OUT/odd-corpus-nvjpeg130.log | sort | uniq -c | head
  table nvjpeg130 dali plain,full
  ;;
6)
  python3 -m pip install -q --no-index --no-deps --target /tmp/nvj133 .carry/nvj/nvidia_nvjpeg-13.3*.whl
  cp /tmp/nvj133/nvidia/cu13/lib/libnvjpeg.so.13 /tmp/site/nvidia/cu13/lib/libnvjpeg.so.13
  versions
  timeout 120 python3 tools/odd_corpus_gpu.py 2>&1 | quiet > $OUT/odd-corpus-nvjpeg133.log; tail -2 $OUT/odd-corpus-nvjpeg133.log
  grep "over threshold" $OUT/odd-corpus-nvjpeg133.log | sort | uniq -c | head
  table nvjpeg133 default,dali plain,full
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py 2>&1 | tail -15 | tee $OUT/pytest-gpu.log
  ;;
esac
