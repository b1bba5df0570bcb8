# Sourced by benchmarks/gpu/run.sh on the GPU host: what every step needs, and the helpers the steps share.
# Nothing here runs a measurement by itself; run.sh's steps call these with the arguments of each table.
W=${W:-/tmp/ffbench}  # the data sets (`data` step); /tmp lives as long as the host stays warm
OUT=${OUT:-/tmp/out}  # the device tool sets $OUT: what is there when the command ends comes back
tag=${TAG:-a}         # names this call's JSON; TAG=b for a second run of a step on the same host
G=benchmarks/gpu
T=$G/train_table.py
mkdir -p "$OUT" /tmp/dali
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # KINDS.md: keep multicast off
# Each call carries the working tree, which replaces the native build: `build` keeps it in /tmp/ffnative.
cp /tmp/ffnative/_native*.so fastfeed/ 2>/dev/null
quiet() { grep -v -iE "nvjpeg2k|nvtiff|^note:|Warning"; }

# -- staging: DALI, the native core, the data sets ------------------------------------------------------------------
stage_dali() {  # $1 = N: DALI's part N, carried as .carry/pN, into /tmp/dali; N = 5 (the last) also installs it
  local n=$1
  [ -d .carry/p$n ] || { echo "stage-dali $n: .carry/p$n is not carried in this call" >&2; return 1; }
  cp .carry/p$n/part.* /tmp/dali/ || return 1
  echo "DALI part $n staged: $(ls /tmp/dali | wc -l) files, $(du -sm /tmp/dali | cut -f1) MiB in /tmp/dali"
  if [ "$n" = 5 ]; then install_dali; fi
}
install_dali() {  # the small wheels (.carry/x2: lmdb, webdataset, ...), DALI from every part in /tmp/dali (the
                  # bundle's sha256 is checked), Lightning (.carry/fw, for tests/test_gpu_frameworks.py)
  if [ -d .carry/x2 ]; then python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/x2/*.whl 2>&1 | tail -1; fi
  bash .carry/p5/install_dali.sh 2>&1 | tail -1 || return 1
  if [ -d .carry/fw ]; then python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/fw/*.whl 2>&1 | tail -1; fi
}
build_native() {  # the native core from this tree, once per host, kept in /tmp/ffnative; xxhash from .carry/x
  lscpu | grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\)|CPU\(s\))"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; python3 --version
  if [ -d .carry/x ]; then python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/x/*.whl; fi
  if ls /tmp/ffnative/_native*.so >/dev/null 2>&1; then
    echo "native core: built earlier on this host (/tmp/ffnative)"
  else
    python3 setup.py -q build_ext --inplace 2>&1 | grep -iE "error"
    mkdir -p /tmp/ffnative && cp fastfeed/_native*.so /tmp/ffnative/ || return 1
  fi
  python3 -c "import fastfeed._native as n; print('native ok, libjpeg', n.HAVE_LIBJPEG)"
}
mk() {  # $1 = set: its images in $W/SET-images (tools/make_dataset.py) and its webdataset shards in $W/SET-wds
  local args
  case $1 in
  base) args="20000" ;;                         # ImageNet-like JPEGs, ~0.2 MP, ~118 KB
  thumb) args="20000 --regime thumb" ;;         # thumbnails, ~100 px, ~7 KB
  half) args="4000 --short-side 560:820" ;;     # photos of ~0.55 MP, ~261 KB
  mid) args="2000 --short-side 1200:1800" ;;    # photos of 1.9-3.4 MP (median ~2.5 MP), ~1.2 MB
  phone) args="512 --regime phone" ;;           # 12-MP phone photos, ~5.9 MB: two batches an epoch
  mixed) args="4000 --regime mixed" ;;          # mixed sizes (thumbnails to 12 MP), 15% PNG
  png) args="4000 --regime png" ;;              # 70% PNG
  detect) detect_set; return ;;                  # bench_detect.py's 2,000 photos with boxes (detection steps)
  *) echo "unknown set $1 (base thumb half mid phone mixed png detect)" >&2; return 1 ;;
  esac
  if [ -e $W/$1-wds/fastfeed.json ]; then echo "$1: made earlier on this host"; return 0; fi
  python3 tools/make_dataset.py $W/$1-images --num-images $args --num-classes 100 --seed 0 | tail -1
  python3 -m fastfeed.cli pack $W/$1-images $W/$1-wds --format wds --shard-size 256MB --jpeg keep \
      --shuffle-seed 0 --workers 16 --quiet --overwrite | tail -1
}
need() {  # what a step needs on this host: "native", "dali", "gpus2", or a data set's name
  local x
  for x in "$@"; do
    case $x in
    native) ls /tmp/ffnative/_native*.so >/dev/null 2>&1 || { echo "run the build step first on this host" >&2; return 1; } ;;
    dali) python3 -c "import nvidia.dali" 2>/dev/null || { echo "DALI is not installed on this host: stage-dali 1..5" >&2; return 1; } ;;
    gpus2) [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "needs two GPUs (nvidia-h200-x2)" >&2; return 1; } ;;
    *) [ -e $W/$x-wds/fastfeed.json ] || { echo "data set $x is missing: run the step 'data $x' first" >&2; return 1; } ;;
    esac
  done
}

# -- the GPU tests --------------------------------------------------------------------------------------------------
gpu_tests() {  # pytest -m gpu on GPU 0: the GPU tests, then tests/test_gpu_frameworks.py (Lightning); logs in $OUT
  CUDA_VISIBLE_DEVICES=0 timeout 450 python3 -m pytest -q -rP -m gpu -p no:cacheprovider tests/test_gpu.py \
      tests/test_detect_loader.py tests/test_detect_gpu_render.py tests/test_segment_loader.py \
      tests/test_instance_loader.py tests/test_profile.py \
      > $OUT/pytest-gpu.log 2>&1
  tail -3 $OUT/pytest-gpu.log
  CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_frameworks.py \
      > $OUT/pytest-gpu-fw.log 2>&1
  tail -2 $OUT/pytest-gpu-fw.log
}

# -- tables (train_table.py) ----------------------------------------------------------------------------------------
table() {  # ImageNet-like (the base set): $1 = tree, $2 = JSON name, $3 = consumers, rest: more train_table.py
           # arguments (later ones win). 150 timed steps after 100 of warm-up, the defaults and DALI's two readers.
  local tree=$1 name=$2 consumers=$3; shift 3
  (cd $tree && CUDA_VISIBLE_DEVICES=0 timeout 400 python3 $T --data $W/base-wds \
      --images $W/base-images --steps 150 --warmup 100 --consumers $consumers --rows default,dali \
      --dali-grid 0.9:4 --json $OUT/table-$name.json "$@" 2>&1 | grep -E "^\[" | quiet \
      | grep -E "img/s|could not|failed|not found" | tail -14)
}
regime() {  # a table on another set: $1 = set, $2 = consumers, $3 = image size, $4 = steps, $5 = warm-up,
            # $6 = --dali-grid, $7 = --extra-ff, $8 = time limit (s): the defaults, $7's rows and ROWS (default:
            # DALI's two readers and the DataLoader); the JSON is table-SET-$tag.json. MAXW: the most warm-up steps
            # (default 100); CORES: taskset's core list for every row (default: all)
  CUDA_VISIBLE_DEVICES=0 timeout $8 ${CORES:+taskset -c $CORES} python3 $T --label $1 --data $W/$1-wds \
      --images $W/$1-images --image-size $3 --steps $4 --warmup $5 --max-warmup ${MAXW:-100} --consumers $2 \
      --rows ${ROWS-default,dali,torch} \
      --dali-grid $6 --extra-ff "$7" --json $OUT/table-$1-${tag:-a}.json 2>&1 | grep -E "^\[" | quiet \
      | grep -E "img/s|could not|failed|not found" | tail -24
}
thumb_table() {  # thumbnails: 64-px crops, 150 steps after 30-400 of warm-up, DALI's webdataset reader at hw 0.9 and
                 # 4 threads: $1 = consumers, $2 = --extra-ff rows, $3 = time limit (s, 400); ROWS (default: the
                 # defaults and DALI's webdataset reader), CORES and tag as regime's
  MAXW=400 ROWS=${ROWS-default,dali-wds} regime thumb $1 64 150 30 0.9:4 "$2" ${3:-400}
}
summary() {  # $1 = fastfeed row, $2 = baseline row (a prefix: the best matching row of each table), $3 = guard
             # (ratio, or "" for none), rest: table JSONs of one step; the means over them and their ratio
  python3 $G/summary.py --row "$1" --baseline "$2" ${3:+--guard $3} "${@:4}"
}

# -- this tree against an earlier one, in the same call ------------------------------------------------------------
OLD_TREE=/tmp/old  # the tree before, unpacked from .carry/old (prepare_carry.sh OLD=<commit>)
detect_set() {  # the detection steps' set, $W/detect (bench_detect.py's: 2,000 photos with boxes), made when missing
  python3 -c "import sys; from pathlib import Path; sys.path.insert(0, 'benchmarks')
from bench_detect import prepare_data; prepare_data(Path('$W/detect'), 2000)"
}
unpack_old() {  # $1 = the carried tarball: the tree before into $OLD_TREE, with this tree's native build
  rm -rf $OLD_TREE && mkdir -p $OLD_TREE && tar -xzf "$1" -C $OLD_TREE \
      && cp /tmp/ffnative/_native*.so $OLD_TREE/fastfeed/ && echo "old tree: $(ls $OLD_TREE)"
}
abba() {  # $1 = name, $2 = consumers, rest: train_table.py arguments; this tree and $OLD_TREE, A B B A (DALI in the
          # first table). $OLD_TREE must have benchmarks/gpu/train_table.py (a commit of this layout or later).
  local name=$1 consumers=$2; shift 2
  table $PWD $name-new-a-$tag $consumers --max-warmup 500 "$@"
  table $OLD_TREE $name-old-a-$tag $consumers --rows default --max-warmup 500 "$@"
  table $OLD_TREE $name-old-b-$tag $consumers --rows default --max-warmup 500 "$@"
  table $PWD $name-new-b-$tag $consumers --rows default --max-warmup 500 "$@"
}

# -- DDP (ddp_scaling.py under torchrun) ----------------------------------------------------------------------------
ddp() {  # $1 = label, $2 = ranks, rest = ddp_scaling.py arguments: one line of img/s, waits, first batch, CPU share
  local label=$1 n=$2; shift 2
  timeout 120 torchrun --standalone --nproc-per-node $n $G/ddp_scaling.py --data $W/base-wds \
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

# -- what comes back ------------------------------------------------------------------------------------------------
bundle_out() {  # $1 = archive name: every file in $OUT packed into $OUT/$1.tar.gz (a call returns at most 8 files)
  [ -n "$(cd $OUT && ls | grep -v '\.tar\.gz$')" ] || return 0
  (cd $OUT && ls | grep -v '\.tar\.gz$' | tar -czf $1.tar.gz -T - && ls | grep -v '\.tar\.gz$' | xargs -r rm -f)
}
