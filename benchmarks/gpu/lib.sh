# Shared by the device rounds since the third session (stage18.sh .. stage25.sh, gpucheck.sh), sourced after staging:
# the data and results folders (W, OUT: defaults below), the DALI parts this call carries, environment, log filter,
# installing DALI and Lightning, the GPU tests, a train_table.py table, an ABBA of two trees, a build-stall probe
# and the DDP row. Functions that name their JSON use the caller's $tag.
W=${W:-/tmp/ffbench}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/dali
# Every DALI part carried in this call, whichever step it belongs to (a path not carried is absent on the host).
cp .carry/p*/part.* /tmp/dali/ 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # KINDS.md: keep multicast off
cp /tmp/ffnative/_native*.so fastfeed/  # built by step 1 from this same tree (the carried tree replaces it)
quiet() { grep -v -iE "nvjpeg2k|nvtiff|^note:|Warning"; }
T=benchmarks/h200/train_table.py
table() {  # $1 = tree, $2 = tag, $3 = consumers, rest: more train_table.py arguments (later ones win)
  local tree=$1 tag=$2 consumers=$3; shift 3
  (cd $tree && CUDA_VISIBLE_DEVICES=0 timeout 400 python3 $T --data $W/base-wds \
      --images $W/base-images --steps 150 --warmup 100 --consumers $consumers --rows default,dali \
      --dali-grid 0.9:4 --json $OUT/table-$tag.json "$@" 2>&1 | grep -E "^\[" | quiet \
      | grep -E "img/s|could not|failed" | tail -14)
}
both_orders() {  # two extra fastfeed rows $B and $C against the defaults, A B C then C B A in another process
  # $1 = name, $2 = consumers, $3 = the first order's --rows, rest: train_table.py arguments; JSON names use $tag
  local name=$1 consumers=$2 rows=$3; shift 3
  table $PWD $name-abc-$tag $consumers --rows $rows --extra-ff "$B;$C" "$@"
  table $PWD $name-cba-$tag $consumers --rows none --extra-ff "$C;$B;ff-default=dict()" "$@"
}
OLD_TREE=/tmp/old  # the tree before (not prepare_carry.sh's OLD, a commit), unpacked from .carry/old, for abba
unpack_old() {  # $1 = the carried tarball: the tree before into $OLD_TREE, with this tree's native build
  rm -rf $OLD_TREE && mkdir -p $OLD_TREE && tar -xzf "$1" -C $OLD_TREE \
      && cp /tmp/ffnative/_native*.so $OLD_TREE/fastfeed/ && echo "old tree: $(ls $OLD_TREE)"
}
abba() {  # $1 = name, $2 = consumers, rest: train_table.py arguments; this tree and $OLD_TREE, ABBA (DALI in the first)
  local name=$1 consumers=$2; shift 2
  table $PWD $name-new-a-$tag $consumers --max-warmup 500 "$@"
  table $OLD_TREE $name-old-a-$tag $consumers --rows default --max-warmup 500 "$@"
  table $OLD_TREE $name-old-b-$tag $consumers --rows default --max-warmup 500 "$@"
  table $PWD $name-new-b-$tag $consumers --rows default --max-warmup 500 "$@"
}
stall_probe() {  # $1 = JSON name, rest: build_stall_probe.py arguments; its build, decode and median-step lines
  local name=$1; shift
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/h200/build_stall_probe.py --json $OUT/build-stall-$name.json \
      "$@" 2>&1 | quiet | grep -E " build | decode |median step"
}
ddp() {  # $1 = label, $2 = ranks, rest = extra args
  local label=$1 n=$2; shift 2
  timeout 120 torchrun --standalone --nproc-per-node $n benchmarks/h200/ddp_scaling.py --data $W/base-wds \
      --json $OUT/ddp-$label.json "$@" >$OUT/ddp-$label.log 2>&1
  [ -e $OUT/ddp-$label.json ] || { echo "$label: no result"; quiet <$OUT/ddp-$label.log | tail -6; return; }
  python3 - "$OUT/ddp-$label.json" "$label" <<'PY' 2>&1 | tail -1
import json, sys
d = json.load(open(sys.argv[1]))
w, c = d["waits_ms_rank0"], d.get("stats_rank0", {}).get("counters", {})
share = round(c["cpu_decoded"] / max(1, c["cpu_decoded"] + c["gpu_decoded"]), 2) if "cpu_decoded" in c else "-"
print(sys.argv[2], round(d["images_per_s"]), "img/s, wait", [round(x, 3) for x in d["wait_fraction_per_rank"]],
      "waits>10ms", sum(x > 10 for x in w), "of", len(w), "first", [round(x, 1) for x in d["first_batch_s_per_rank"]],
      "cpu share", share)
PY
}
install_dali() {  # the small wheels the host lacks, then DALI from the parts the earlier calls left in /tmp/dali
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/x2/*.whl 2>&1 | tail -1
  bash .carry/p5/install_dali.sh 2>&1 | tail -1 || exit 1
}
install_frameworks() {  # Lightning and its pure-Python dependencies, from .carry/fw (test_gpu_frameworks.py)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/fw/*.whl 2>&1 | tail -1
}
gpu_tests() {  # pytest -m gpu on GPU 0, the log in $OUT
  CUDA_VISIBLE_DEVICES=0 timeout 240 python3 -m pytest -q -rP -m gpu -p no:cacheprovider tests/test_gpu.py \
      > $OUT/pytest-gpu.log 2>&1
  tail -3 $OUT/pytest-gpu.log
}
install_and_test() {  # step 5 of the later stage scripts: DALI and Lightning installed; the GPU tests unless TESTS=0
  install_dali
  install_frameworks
  if [ "${TESTS:-1}" = 1 ]; then
    gpu_tests
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_frameworks.py \
        > $OUT/pytest-gpu-fw.log 2>&1
    tail -2 $OUT/pytest-gpu-fw.log
  fi
}
bench_rows() {  # `fastfeed bench` on the ImageNet-like set with each consumer given ($@), its JSON in $OUT
  local c
  for c in "$@"; do
    CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -c "import sys; from fastfeed.cli import main; sys.exit(main())" \
        bench $W/base-wds --consumer $c --dtype float16 --channels-last --no-progress --json $OUT/bench-$c.json \
        2>&1 | quiet | grep -E "note|samples/s|settings|steps\)|data wait" | head -8
  done
}
regime() {  # a regime table (sets.sh): $1 = set, $2 = consumers, $3 = image size, $4 = steps, $5 = warm-up,
            # $6 = --dali-grid, $7 = --extra-ff, $8 = time limit (s): the defaults, $7's rows and ROWS (default:
            # DALI's two readers and the DataLoader); the JSON named by the caller's $tag. MAXW: the most warm-up
            # steps (default 100); CORES: taskset's core list for every row (default: all)
  CUDA_VISIBLE_DEVICES=0 timeout $8 ${CORES:+taskset -c $CORES} python3 $T --label $1 --data $W/$1-wds \
      --images $W/$1-images --image-size $3 --steps $4 --warmup $5 --max-warmup ${MAXW:-100} --consumers $2 \
      --rows ${ROWS-default,dali,torch} \
      --dali-grid $6 --extra-ff "$7" --json $OUT/table-$1-${tag:-a}.json 2>&1 | grep -E "^\[" | quiet \
      | grep -E "img/s|could not|failed|reniced" | tail -24
}
thumb_table() {  # the thumbnails' table of stage45.sh on: 64-px crops, 150 steps after 30-400 of warm-up, DALI's
                 # reader at hw 0.9 and 4 threads: $1 = consumers, $2 = --extra-ff rows, $3 = time limit (s, 400);
                 # ROWS (default: the defaults and DALI's webdataset reader), CORES and tag as regime's
  MAXW=400 ROWS=${ROWS-default,dali-wds} regime thumb $1 64 150 30 0.9:4 "$2" ${3:-400}
}
bundle_out() {  # $1 = archive name: every file in $OUT packed into $OUT/$1.tar.gz (a call returns at most 8 files)
  (cd $OUT && ls | grep -v '\.tar\.gz$' | tar -czf $1.tar.gz -T - && ls | grep -v '\.tar\.gz$' | xargs rm -f)
}
