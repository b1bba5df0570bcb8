#!/usr/bin/env bash
# On the GPU host without DALI: the Lightning example end to end (fastfeed's CPU decoders feeding a CUDA device).
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/extra/*.whl
if [ ! -e /usr/include/jpeglib.h ]; then
  mkdir -p /tmp/jpeg && for f in .carry/extra/*.deb; do dpkg -x "$f" /tmp/jpeg; done
  export FASTFEED_LIBJPEG_DIR=/tmp/jpeg
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 setup.py -q build_ext --inplace 2>&1 | grep -i error || true
python3 -m fastfeed.cli demo-data /tmp/lt/images --num-images 1024 --num-classes 10
python3 -m fastfeed.cli pack /tmp/lt/images /tmp/lt/wds --quiet
python3 -c "import lightning; print('lightning', lightning.__version__)"
timeout 300 python3 examples/train_lightning.py /tmp/lt/wds --epochs 2 2>&1 | tail -25
ls /tmp/lt
