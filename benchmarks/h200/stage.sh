#!/usr/bin/env bash
# One step of a GPU-host session (see benchmarks/RESULTS.md, "How the H200 numbers were taken").
# The host has no network: DALI arrives in 5 parts (../shared/dali-offline), one per call, calls back to back.
#   bash benchmarks/h200/stage.sh K [bench args...]     K = 1..5; the 5th installs DALI and runs the benchmarks
set -uo pipefail
K=$1; shift
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/dali
cp .carry/p$K/part.* /tmp/dali/ 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
W=/tmp/ffbench
case $K in
1)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; python3 --version
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/p1/extra/*.whl
  if [ ! -e /usr/include/jpeglib.h ]; then
    mkdir -p /tmp/jpeg && for f in .carry/p1/extra/*.deb; do dpkg -x "$f" /tmp/jpeg; done
    export FASTFEED_LIBJPEG_DIR=/tmp/jpeg
  fi
  python3 setup.py -q build_ext --inplace 2>&1 | grep -iE "error" ; python3 -c "import fastfeed._native as n; print('native ok, libjpeg', n.HAVE_LIBJPEG)"
  python3 benchmarks/bench_gpu.py --workdir $W --sections data --num-images ${NUM_IMAGES:-20000}
  ;;
2|3|4)
  python3 -m pytest -q -x -p no:cacheprovider tests/test_ring.py tests/test_sampling.py 2>&1 | tail -3
  ;;
5)
  bash .carry/p5/install_dali.sh || exit 1
  python3 tools/gpu_selftest.py $W/base-images --num 256 --batch 128 2>&1 | tee $OUT/selftest.log
  python3 benchmarks/bench_gpu.py --workdir $W --json $OUT/gpu.json "$@" 2>&1 | tee $OUT/bench_gpu.log
  ;;
esac
