#!/usr/bin/env bash
# Everything benchmarks/gpu/run.sh carries to the offline H200 host, made here (needs the package index), into .carry/
# (git-ignored): DALI in parts (../shared/dali-offline/prepare_dali_carry.sh), re-split so that a call carrying a part
# and the working tree stays under the 64 MiB a call may carry, and the small wheels:
#   .carry/p1..p4   56 MiB of DALI's bundle each          .carry/p5  the rest, the last 4 MiB of p1..p4 (part.0Nz),
#                                                                    install_dali.sh and the bundle's sha256
#   .carry/x        xxhash (with part 1: `build`)          .carry/x2  lmdb, webdataset and what it needs (with part 5)
#   .carry/fw       lightning, lightning-utilities, torchmetrics (tests/test_gpu_frameworks.py, with part 5)
#   .carry/ul       ultralytics and what it imports that the host lacks (run.sh's `detect` step)
#   .carry/old      with OLD=<commit>: that tree's fastfeed/ and benchmarks/ as tree-<commit>.tar.gz (run.sh's `abba`
#                   step runs this tree against it; the commit must have benchmarks/gpu/)
#     bash benchmarks/gpu/prepare_carry.sh            (OLD=<commit> bash ... to add .carry/old)
# The host runs Python 3.12 (manylinux x86_64); install_dali.sh concatenates /tmp/dali/part.* in name order, so
# part.00, part.00z, part.01, ... reassemble the bundle. Each call also carries the working tree (tracked and
# untracked-not-ignored files): the largest call (stage-dali 5 with .carry/x2 and .carry/fw) takes ~61 MiB with a
# 4 MiB tree; this script prints the tree's size. If the tree grows past ~7 MiB, move more of p1..p4 into a .carry/p6
# carried by a call that has room: a call over 64 MiB is refused, and a later step then finds no DALI.
set -euo pipefail
REPO=$(git rev-parse --show-toplevel)
cd "$REPO"
bash ../shared/dali-offline/prepare_dali_carry.sh  # leaves .carry/p1..p5 (60 MiB parts); removes the rest of .carry
keep=$((56 * 1024 * 1024))
for k in 1 2 3 4; do
  f=.carry/p$k/part.0$((k - 1))
  [ "$(stat -c %s "$f")" -gt $keep ] || continue
  tail -c +$((keep + 1)) "$f" > .carry/p5/part.0$((k - 1))z
  truncate -s $keep "$f"
done
check=$(mktemp -d); cp .carry/p*/part.* "$check"/
cat "$check"/part.* | sha256sum | cut -d' ' -f1 | diff -q - .carry/p5/bundle.sha256 >/dev/null \
  || { echo "the re-split parts do not reassemble the bundle" >&2; rm -rf "$check"; exit 1; }
rm -rf "$check"
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
   --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
pip=${PIP:-.venv/bin/pip}
mkdir -p .carry/x .carry/x2 .carry/fw
$pip download -q $P -d .carry/x xxhash 2>&1 | grep -v "^WARNING: Location" || true
$pip download -q $P -d .carry/x2 lmdb webdataset braceexpand tqdm fsspec 2>&1 | grep -v "^WARNING: Location" || true
$pip download -q $P -d .carry/fw lightning==2.6.6 lightning-utilities torchmetrics 2>&1 \
  | grep -v "^WARNING: Location" || true
mkdir -p .carry/ul
$pip download -q $P -d .carry/ul ultralytics==8.4.190 ultralytics-thop pyyaml tqdm nvidia-ml-py psutil 2>&1 \
  | grep -v "^WARNING: Location" || true
if [ -n "${OLD:-}" ]; then
  mkdir -p .carry/old
  git archive "$OLD" fastfeed benchmarks | gzip -6 > .carry/old/tree-"$OLD".tar.gz
fi
du -sh .carry/* | tr '\n' ' '; echo
echo "tracked tree: $(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1) bytes (each call carries it too)"
