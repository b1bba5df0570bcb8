#!/usr/bin/env bash
# The GPU tables on the device tool's H200 host, as named steps; benchmarks/README.md ("GPU tables") has the calls in
# order and what each carries.
#
#   bash benchmarks/gpu/run.sh STEP [ARG...] [STEP [ARG...]] ...       steps run in the order given, in this call
#
# The host has no network and starts bare: DALI travels in five parts of under 64 MiB (.carry/p1..p5, made here by
# `bash benchmarks/gpu/prepare_carry.sh`), one part per call, and the calls must come back to back: /tmp, where DALI,
# the native build and the data sets live, survives only while the host stays warm (30 s after a call). A call
# returns at most 8 files: each step that writes results packs them into one archive, $OUT/STEP-$TAG.tar.gz.
#
# Staging (carry per call):
#   stage-dali N       DALI's part N into /tmp/dali (carry .carry/pN); N=5 also installs DALI, and lmdb/webdataset
#                      and Lightning when .carry/x2 and .carry/fw are carried (carry [.carry/p5, .carry/x2, .carry/fw])
#   build              the native core from this tree, kept in /tmp/ffnative (carry .carry/x: xxhash)
#   data [SET...]      the data sets (default: base): base thumb half mid phone mixed png detect (lib.sh `mk`)
#   gpu-tests          pytest -m gpu: tests/test_gpu.py, tests/test_{detect,segment,instance}_loader.py,
#                      tests/test_detect_gpu_render.py, tests/test_profile.py, tests/test_gpu_frameworks.py
# Tables (carry nothing; the sets each needs in brackets):
#   train-resnet50     ResNet-50 training, ImageNet-like: two processes, each with fastfeed's defaults, its GPU
#                      decode ("gpu") and DALI's file reader (hw 0.9, 4 threads), the two fastfeed rows in both
#                      orders, 300 timed steps after up to 500 of warm-up; guard: defaults >= 0.97x DALI [base]
#   train-resnet18     the same with ResNet-18 (no guard) [base]
#   alone              the loader alone, ImageNet-like: the defaults and DALI's webdataset reader, then the defaults
#                      again in a second process [base]
#   first-batch        seconds from Loader(...) to the first batch, fresh processes: 12-MP photos x4 (one Loader),
#                      ~2.5-MP and ImageNet-like x2 (two Loaders each), thumbnails at 64 px x2 (four Loaders each)
#                      [phone mid base thumb]
#   first-step         a script's first batch and first step, ResNet-50 built after Loader(...), 4 processes [base]
#   photos             photos of ~0.55 MP: alone and ResNet-50, the defaults, DALI's two readers, the DataLoader [half]
#   photos-alone       the same photos alone after the tuners settled, then DALI's webdataset reader [half]
#   mid                photos of 1.9-3.4 MP, alone and ResNet-50: the defaults, DALI's webdataset reader [mid]
#   mid-alone          the same alone after the tuners settled (up to 400 warm-up steps) [mid]
#   phone              12-MP phone photos alone: the defaults, DALI's webdataset reader [phone]
#   thumb              thumbnails, 64-px crops, all cores: alone, ResNet-18 and -50 at 64 px: the defaults, the GPU
#                      decode, DALI's webdataset reader [thumb]
#   thumb-cores N      the same with every row under `taskset -c 0-(N-1)` (a rank with N cores) [thumb]
#   mixed              mixed sizes + 15% PNG, alone and ResNet-50: the defaults, DALI's webdataset reader, the
#                      DataLoader [mixed]
#   png                70% PNG, alone and ResNet-50: the defaults, DALI's two readers (8 threads), the DataLoader [png]
#   ddp                two GPUs (nvidia-h200-x2), ResNet-50, DDP: the defaults on 1 and 2 GPUs, DALI's webdataset
#                      reader on 1 and 2, 100 timed steps after 300 of warm-up [base]
#   ddp-reversed       ddp in the other order (DALI first), then ResNet-18 defaults on 1 and 2 GPUs [base]
#   odd-corpus         the decode contract on the GPU: tools/odd_corpus_gpu.py (hardware and CUDA JPEG decoders)
#   image-text         image-text batches at 224 px on adopted shards against DALI's webdataset reader
#                      (image_text.py: 5,000 photos with captions, batch 256, the loaders alone; and fastfeed
#                      with verify_checksums=False, what hashing each image beside its fields costs; NOCHECK= drops
#                      that row, VARIANTS='[{...}]' adds rows of other Loader arguments, ROUNDS=N, IMG2DATASET=256
#                      the photos as img2dataset's default writes them)
#   index [N...]       fastfeed index against tar -tf + sha256sum over the same shards (bench_index.py: 3,000
#                      ImageNet-like JPEGs with captions in 6 shards), on all cores and under taskset -c 0-(N-1)
#                      for each N; needs webdataset (stage-dali 5 installs .carry/x2) [makes its own set]
#   progressive        20% progressive JPEGs packed --jpeg keep / --jpeg baseline against all baseline, the loader
#                      alone (bench_gpu.py --sections progressive; makes its own sets)
#   detect             detection batches at 640 px, batch 64, to the GPU (DALI staged: the GPU path; else the CPU
#                      one): fastfeed against ultralytics' own train loader (bench_detect.py; carry .carry/ul: the
#                      ultralytics wheels), on 4 cores (taskset) and 16; FF_KWARGS='{"pipelines": 2}' passes more
#                      Loader arguments, MODE=val compares the evaluation batches, VARIANT=png (bench_detect.py
#                      --variant) a kind of data the project does not ship, CORE_COUNTS="4" fewer core counts
#                      [makes its own set]
#   detect-sweep       the GPU detection loader alone under several Loader settings, side by side (detect_sweep.py;
#                      SWEEP='[{...}, ...]' for other settings) [makes detect's set]
#   detect-ceiling     where the GPU detection path's ceiling is: DALI's whole-image decode alone and GpuDetectDecoder
#                      with its steps timed, 1-4 pipelines (detect_ceiling.py); with py-spy carried (.carry/spy) the
#                      Loader's threads and the GIL sampled [makes detect's set]
#   detect-kernels     the GPU time a detection batch costs, kernel by kernel (detect_kernels.py, torch.profiler):
#                      training batches in float16 (the loader-alone tables) and uint8 (YOLO training's), evaluation
#                      batches; with .carry/old (OLD=<commit> prepare_carry.sh) the training rows of that tree too
#                      [makes detect's set]
#   detect-abba        the detection loader alone (detect_sweep.py, SWEEP or 4 pipelines and the defaults, EACH
#                      seconds a row) in this tree and the one in .carry/old, A B B A, each in its own process
#                      (carry .carry/old: OLD=<commit> prepare_carry.sh) [makes detect's set]
#   ssd [N...]         SSD-style batches at 640 px, batch 64, to the GPU: fastfeed's IoU crop against DALI's SSD
#                      pipeline (bench_ssd.py --device cuda: COCO reader, random_bbox_crop, the window decoded on
#                      the GPU), on 16 cores and under taskset -c 0-(N-1) for each N [makes detect's set]
#   yolo-train [N...]  YOLOv8n training (yolo_train.py), batch 64, 640 px, bf16, under taskset -c 0-(N-1) for each N
#                      (default 4): the resident-batch ceiling, ultralytics' loader, fastfeed (carry .carry/ul);
#                      MODELS="yolov8n yolov8s" for other models, FEEDS="resident fastfeed" for fewer feeds,
#                      VARIANT=png on bench_detect.py's kind of data [makes detect's set]
#   profile            fastfeed profile on a plain ResNet-50 script (rn50_train.py): fed by a DataLoader with 2
#                      workers (verdict: data supply), by fastfeed's defaults (not data supply), and the latter again
#                      without the profiler (its cost) [base]
#   abba [CONSUMERS]   this tree against the one carried in .carry/old (OLD=<commit> prepare_carry.sh), A B B A,
#                      ImageNet-like, default consumers resnet50 [base]
# TAG=b names a second run's JSON on the same host. Each table step's command lines are the newest that measured its
# table in the experiment record (the stageNN.sh scripts at git tag lab-2026-12), less the rows of one-off questions.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/lib.sh

STEPS=" stage-dali build data gpu-tests train-resnet50 train-resnet18 alone first-batch first-step photos photos-alone
        mid mid-alone phone thumb thumb-cores mixed png ddp ddp-reversed odd-corpus image-text index progressive detect detect-sweep detect-ceiling detect-kernels detect-abba ssd yolo-train
        profile abba "
STEPS=$(echo $STEPS)  # one line, single spaces
STEPS=" $STEPS "

fb() {  # first_batch.py: $1 = set, $2 = run number, $3 = Loaders, $4 = batches after the first, $5 = image size
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 $G/first_batch.py --data $W/$1-wds --batches $4 --loaders $3 \
      --image-size ${5:-224} --json $OUT/first-batch-$1-$2-$tag.json 2>&1 \
      | grep -E '"(constructor|first_batch)_s"|"images_per_s"' | tr -d '\n '
  echo " <- $1 $2"
}
train() {  # $1 = consumer: two processes, the defaults and the GPU decode in both orders, DALI's file reader last
  local gpu='gpu=dict(decoder="dali")'
  table $PWD train-$1-1-$tag $1 --per-step --steps 300 --max-warmup 500 --rows default,dali-file --extra-ff "$gpu"
  table $PWD train-$1-2-$tag $1 --per-step --steps 300 --max-warmup 500 --rows dali-file \
      --extra-ff "$gpu;ff-default=dict()"
}

run_step() {  # $1 = step, rest: its arguments
  local step=$1 n set; shift
  case $step in
  stage-dali) stage_dali "${1:?stage-dali N}" ;;
  build) build_native ;;
  data) need native || return 1
        for set in ${@:-base}; do time mk $set; done ;;
  gpu-tests) need native dali || return 1
             gpu_tests ;;
  train-resnet50) need native base || return 1
                  train resnet50
                  summary ff-default dali-file ${GUARD:-0.97} $OUT/table-train-resnet50-*-$tag.json ;;
  profile) need native base || return 1
           # name, profiler warm-up and window, script steps, feed (the DataLoader's 2 workers give ~10x fewer steps/s)
           for feed in "images 5 15 30 --images $W/base-images" "packed 25 40 80 --packed $W/base-wds"; do
             set -- $feed
             CUDA_VISIBLE_DEVICES=0 timeout 280 python3 -m fastfeed.cli profile --warmup $2 --steps $3 \
                 --json $OUT/profile-$1-$tag.json -- python3 benchmarks/gpu/rn50_train.py "${@:5}" --steps $4 2>&1 \
                 | grep -v "^Warning" | tail -32
           done
           CUDA_VISIBLE_DEVICES=0 timeout 120 python3 benchmarks/gpu/rn50_train.py --packed $W/base-wds --steps 80 ;;
  train-resnet18) need native base || return 1
                  train resnet18
                  summary ff-default dali-file "" $OUT/table-train-resnet18-*-$tag.json ;;
  alone) need native base || return 1
         table $PWD alone-1-$tag none --rows default,dali-wds --steps 200 --warmup 50 --max-warmup 400
         table $PWD alone-2-$tag none --rows default --steps 200 --warmup 50 --max-warmup 400
         summary ff-default dali-wds "" $OUT/table-alone-*-$tag.json ;;
  first-batch) need native phone mid base thumb || return 1
               for n in 1 2 3 4; do fb phone $n 1 1; done
               for set in mid base; do for n in 1 2; do fb $set $n 2 4; done; done
               for n in 1 2; do fb thumb $n 4 4 64; done ;;
  first-step) need native base || return 1
              CUDA_VISIBLE_DEVICES=0 timeout 300 python3 $G/first_step.py $W/base-wds --device cuda \
                  --model resnet50 --batch 256 --rounds 2 --json $OUT/first-step-$tag.json 2>&1 | quiet | tail -6 ;;
  photos) need native half || return 1
          regime half none,resnet50 224 50 10 0.9:4,1.0:2 '' 280 ;;
  photos-alone) need native half || return 1
                table $PWD alone-half-$tag none --data $W/half-wds --images $W/half-images --label half \
                    --rows default --steps 150 --warmup 50 --max-warmup 400
                ROWS=dali-wds tag=dali-$tag regime half none 224 100 20 0.9:4,1.0:2 '' 120 ;;
  mid) need native mid || return 1
       ROWS=default,dali-wds regime mid none,resnet50 224 40 10 0.9:4 '' 300 ;;
  mid-alone) need native mid || return 1
             MAXW=400 ROWS=default,dali-wds tag=alone-$tag regime mid none 224 80 20 0.9:4 '' 300 ;;
  phone) need native phone || return 1
         ROWS=default,dali-wds regime phone none 224 16 8 0.9:4 '' 300 ;;
  thumb) need native thumb || return 1
         tag=cores16-$tag thumb_table none,resnet18,resnet50 'gpu=dict(decoder="dali")' ;;
  thumb-cores) n=${1:?thumb-cores N}
               need native thumb || return 1
               CORES=0-$((n - 1)) tag=cores$n-$tag thumb_table none,resnet18,resnet50 'gpu=dict(decoder="dali")' ;;
  mixed) need native mixed || return 1
         ROWS=default,dali-wds,torch regime mixed none,resnet50 224 40 10 0.9:4 '' 300 ;;
  png) need native png || return 1
       regime png none,resnet50 224 40 10 0.9:8 '' 280 ;;
  ddp|ddp-reversed)
       need native base gpus2 || return 1
       local long="--warmup 300 --steps 100" dali="--loader dali-wds --dali-grid 1.0:4"
       if [ $step = ddp ]; then
         ddp one-$tag 1 $long; ddp two-$tag 2 $long; ddp dali1-$tag 1 $long $dali; ddp dali2-$tag 2 $long $dali
       else
         ddp dali2-b-$tag 2 $long $dali; ddp dali1-b-$tag 1 $long $dali; ddp two-b-$tag 2 $long; ddp one-b-$tag 1 $long
         ddp r18-one-$tag 1 $long --arch resnet18; ddp r18-two-$tag 2 $long --arch resnet18
       fi ;;
  image-text) need native dali || return 1
              CUDA_VISIBLE_DEVICES=0 timeout 400 python3 $G/image_text.py --workdir $W/image-text \
                  ${VARIANTS:+--variants "$VARIANTS"} ${ROUNDS:+--rounds $ROUNDS} ${NOCHECK---no-check-row} \
                  ${IMG2DATASET:+--img2dataset-size $IMG2DATASET} \
                  --json $OUT/image-text-$tag.json 2>&1 | grep -E "^round|^fastfeed|images," ;;
  odd-corpus) need native dali || return 1
              CUDA_VISIBLE_DEVICES=0 timeout 120 python3 tools/odd_corpus_gpu.py 2>&1 | quiet > $OUT/odd-corpus-$tag.log
              tail -1 $OUT/odd-corpus-$tag.log
              grep "over threshold" $OUT/odd-corpus-$tag.log | sort | uniq -c | head -5 ;;
  index) need native || return 1
         for cores in 16 "$@"; do
           timeout 300 taskset -c 0-$((cores - 1)) python3 benchmarks/bench_index.py --workdir $W/index \
               --num-images 3000 --per-shard 500 --rounds 3 --json $OUT/index-$cores-$tag.json 2>&1 | tail -4
         done ;;
  progressive) need native || return 1
               CUDA_VISIBLE_DEVICES=0 timeout 550 python3 $G/bench_gpu.py --workdir $W --sections progressive \
                   --json $OUT/progressive-$tag.json 2>&1 | quiet | grep -E "^\[|img/s" | tail -8 ;;
  detect) need native || return 1
          [ -d .carry/ul ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/ul/*.whl
          for cores in ${CORE_COUNTS:-4 16}; do
            CUDA_VISIBLE_DEVICES=0 YOLO_OFFLINE=1 timeout 240 taskset -c 0-$((cores - 1)) python3 \
                benchmarks/bench_detect.py --workdir $W/detect --num-images 2000 --batch 64 --device cuda \
                --seconds 25 --mode ${MODE:-train} ${FF_KWARGS:+--loader-kwargs "$FF_KWARGS"} \
                ${VARIANT:+--variant $VARIANT} \
                --json $OUT/detect-$cores-$tag.json 2>&1 \
                | grep -E "^round|^fastfeed /|images,"
          done
          (cd $OUT && tar -czf detect-$tag.tar.gz detect-*-$tag.json && rm detect-*-$tag.json) ;;
  detect-sweep) need native dali || return 1
          detect_set
          CUDA_VISIBLE_DEVICES=0 timeout 500 python3 $G/detect_sweep.py $W/detect/wds ${SWEEP:+--configs "$SWEEP"} \
              2>&1 | grep "img/s" ;;
  detect-ceiling) need native dali || return 1
          detect_set
          nvidia-smi dmon -s u -o T > $OUT/dmon.txt 2>&1 &  # the GPU's SM and JPEG-engine utilisation, each second
          local dmon=$!
          CUDA_VISIBLE_DEVICES=0 timeout 300 python3 $G/detect_ceiling.py $W/detect/wds 2>&1 | grep -E "img/s|images in"
          if [ -x .carry/spy/py-spy ]; then  # where the Loader's threads spend their time, and who holds the GIL
            CUDA_VISIBLE_DEVICES=0 timeout 100 python3 $G/detect_sweep.py $W/detect/wds --seconds 60 \
                --configs '[{"pipelines": 4}]' > $OUT/spy-loader.log 2>&1 &
            local loader=$!
            sleep 20
            local pid=$(pgrep -f "^python3 .*detect_sweep.py" | head -1)
            .carry/spy/py-spy record --pid $pid -d 8 -r 250 -f raw --threads --nonblocking -o $OUT/spy-all.txt 2>&1 | tail -1
            .carry/spy/py-spy record --pid $pid -d 8 -r 250 -f raw --gil --nonblocking -o $OUT/spy-gil.txt 2>&1 | tail -1
            wait $loader; grep img/s $OUT/spy-loader.log
          fi
          kill $dmon
          (cd $OUT && tar -czf detect-ceiling-$tag.tar.gz dmon.txt spy-* 2>/dev/null; rm -f dmon.txt spy-*) ;;
  detect-kernels) need native dali || return 1
          detect_set
          local k=$PWD/$G/detect_kernels.py old
          old=$(ls .carry/old/tree-*.tar.gz 2>/dev/null | head -1)
          [ -n "$old" ] && unpack_old "$old"
          CUDA_VISIBLE_DEVICES=0 timeout 120 python3 $k $W/detect/wds --label this 2>&1 | grep -E "^this"
          [ -n "$old" ] && (cd $OLD_TREE && PYTHONPATH=/tmp/site:$OLD_TREE CUDA_VISIBLE_DEVICES=0 timeout 120 \
              python3 $k $W/detect/wds --label old 2>&1 | grep -E "^old")
          CUDA_VISIBLE_DEVICES=0 timeout 120 python3 $k $W/detect/wds --dtype uint8 --label this 2>&1 | grep -E "^this"
          [ -n "$old" ] && (cd $OLD_TREE && PYTHONPATH=/tmp/site:$OLD_TREE CUDA_VISIBLE_DEVICES=0 timeout 120 \
              python3 $k $W/detect/wds --dtype uint8 --label old 2>&1 | grep -E "^old")
          CUDA_VISIBLE_DEVICES=0 timeout 120 python3 $k $W/detect/wds --mode val --label this 2>&1 | grep -E "^this"
          ;;
  detect-abba) need native dali || return 1
          local old
          old=$(ls .carry/old/tree-*.tar.gz 2>/dev/null | head -1)
          [ -n "$old" ] || { echo "detect-abba: carry .carry/old (OLD=<commit> bash benchmarks/gpu/prepare_carry.sh)" >&2; return 1; }
          unpack_old "$old" || return 1
          detect_set
          local configs=${SWEEP:-'[{"pipelines": 4}, {}]'}
          local tree label
          for tree in $PWD $OLD_TREE $OLD_TREE $PWD; do  # each its own process, its own fastfeed first on the path
            label=old; [ $tree = $PWD ] && label=this
            (cd $tree && PYTHONPATH=/tmp/site:$tree CUDA_VISIBLE_DEVICES=0 timeout 150 python3 $G/detect_sweep.py \
                $W/detect/wds --seconds ${EACH:-20} --configs "$configs" 2>&1 | grep "img/s" | sed "s|^|$label |")
          done ;;
  ssd) need native dali || return 1
       for cores in 16 "$@"; do
         CUDA_VISIBLE_DEVICES=0 timeout 240 taskset -c 0-$((cores - 1)) python3 benchmarks/bench_ssd.py \
             --workdir $W/detect --num-images 2000 --batch 64 --device cuda --seconds 25 \
             ${FF_KWARGS:+--loader-kwargs "$FF_KWARGS"} --json $OUT/ssd-$cores-$tag.json 2>&1 \
             | grep -E "^round|^fastfeed /|images,"
       done ;;
  yolo-train) need native dali || return 1
          [ -d .carry/ul ] && python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/ul/*.whl
          for model in ${MODELS:-yolov8n}; do
            for cores in ${@:-4}; do
              for feed in ${FEEDS:-resident ultralytics fastfeed}; do
                CUDA_VISIBLE_DEVICES=0 YOLO_OFFLINE=1 timeout 200 taskset -c 0-$((cores - 1)) python3 \
                    benchmarks/gpu/yolo_train.py --feed $feed --model $model.yaml --workdir $W/detect \
                    ${VARIANT:+--variant $VARIANT} \
                    --json $OUT/yolo-$model-$cores-$feed-$tag.json 2>&1 | grep -E '^\{|decoder=|Error' | tail -2
              done
            done
          done
          (cd $OUT && tar -czf yolo-train-$tag.tar.gz yolo-*-$tag.json && rm yolo-*-$tag.json) ;;
  abba) need native base || return 1
        local old
        old=$(ls .carry/old/tree-*.tar.gz 2>/dev/null | head -1)
        [ -n "$old" ] || { echo "abba: carry .carry/old (OLD=<commit> bash benchmarks/gpu/prepare_carry.sh)" >&2; return 1; }
        unpack_old "$old" || return 1
        abba abba "${1:-resnet50}" ;;
  esac
}

[ $# -gt 0 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d'; exit 2; }
status=0
while [ $# -gt 0 ]; do
  step=$1; shift
  [[ "$STEPS" == *" $step "* ]] || { echo "unknown step: $step (bash benchmarks/gpu/run.sh lists them)" >&2; exit 2; }
  args=()
  while [ $# -gt 0 ] && [[ "$STEPS" != *" $1 "* ]]; do args+=("$1"); shift; done
  echo "== $step${args[*]:+ ${args[*]}} ($(date -u +%H:%M:%S) UTC)"
  run_step "$step" "${args[@]}" || status=1
  case $step in
  stage-dali|build|data) ;;
  *) name=$step${args[*]:+-${args[*]}}; bundle_out "${name// /-}-$tag" ;;
  esac
done
exit $status
