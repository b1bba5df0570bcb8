#!/usr/bin/env bash
# The GPU tests on the tree as it is, with nothing else staged (no datasets): the shortest device check, ~3.5 min.
#   bash benchmarks/h200/gpucheck.sh K    K = 1: native build + DALI part 1; 2..4: DALI parts; 5: install, pytest -m gpu
# Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2]. /tmp survives only while
# the machine stays warm (30 s after a call): make the calls back to back.
set -uo pipefail
K=$1
if [ "$K" = 5 ]; then
  source benchmarks/h200/lib.sh  # copies part 5 and the native build back (the carried tree replaced it)
  install_dali
  gpu_tests
  exit
fi
mkdir -p /tmp/dali
cp .carry/p$K/part.* /tmp/dali/ 2>/dev/null
if [ "$K" = 1 ]; then
  export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/x/*.whl
  python3 setup.py -q build_ext --inplace 2>&1 | grep -iE "error"
  mkdir -p /tmp/ffnative && cp fastfeed/_native*.so /tmp/ffnative/
  python3 -c "import fastfeed._native as n; print('native ok, libjpeg', n.HAVE_LIBJPEG)"
fi
