#!/usr/bin/env bash
# Issue 14, nineteenth session, round 2 (2026-12-02), on one nvidia-h200: DALI pipelines on the CPU backend now built
# with nvImageCodec's CPU extensions only (fastfeed/decode/codecs.py; round 1's codec_probe.py: 4 ms against 1,040 ms
# per build). Each A/B sets NVIMGCODEC_EXTENSIONS_PATH for the B side, which fastfeed leaves alone: EVERY = the folder
# of every extension (what DALI loads by itself: the behaviour before codecs.py), TRIM = all but nvJPEG2000 and nvTIFF
# (a candidate for GPU pipelines, whose data is JPEG and PNG).
#   bash benchmarks/h200/stage42.sh K     K = 1..4: staging as stage31.sh (SETS2 default: thumb; SETS3=phone)
#                                          5: DALI and Lightning installed; the GPU tests unless TESTS=0
#                                          6: codec_probe.py; tests/test_dali_codecs.py on a GPU host; first batch in
#                                             fresh processes: thumbnails (64 px) ours / EVERY / EVERY / ours, and
#                                             ImageNet-like ours / TRIM / TRIM / ours
#                                          7: thumbnails beside ResNet-50 (64 px crops): ours (with DALI's webdataset
#                                             reader), EVERY, EVERY, ours
#                                          8: 12-MP photos alone: the defaults and DALI's webdataset reader (hw 0.9, 4
#                                             threads, its best in the sixth session)
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK],
# K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "thumb" "phone"
source benchmarks/h200/lib.sh
tag=${TAG:-a}
EVERY=$(python3 -c "from fastfeed.decode.codecs import extensions_folder as f; print(f() or '')" 2>/dev/null)
TRIM=/tmp/trim
if [ -n "$EVERY" ] && [ ! -d $TRIM ]; then
  mkdir -p $TRIM
  for f in $EVERY/*; do case ${f##*/} in libnvjpeg2k*|libnvtiff*) ;; *) ln -s $f $TRIM/ ;; esac; done
fi
fb() {  # $1 = set, $2 = image size, $3 = label, $4 = NVIMGCODEC_EXTENSIONS_PATH ('': fastfeed's own choice)
  env ${4:+NVIMGCODEC_EXTENSIONS_PATH=$4} CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/h200/first_batch.py \
      --data $W/$1-wds --image-size $2 --batches 4 --json $OUT/first-batch-$1-$3-$tag.json 2>&1 \
      | grep -E '"(constructor|first_batch)_s"' | tr -d '\n '
  echo " <- $1 $3"
}
case $K in
5) install_and_test ;;
6) CUDA_VISIBLE_DEVICES=0 timeout 300 python3 benchmarks/h200/codec_probe.py --json $OUT/codec-probe-$tag.json \
       --variants default,every,gpu-trim,cpu-ext 2>&1 | grep -E "^\["
   CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_dali_codecs.py 2>&1 | tail -1
   fb thumb 64 ours-1 ''; fb thumb 64 every-1 $EVERY; fb thumb 64 every-2 $EVERY; fb thumb 64 ours-2 ''
   fb base 224 ours-1 ''; fb base 224 trim-1 $TRIM; fb base 224 trim-2 $TRIM; fb base 224 ours-2 '' ;;
7) for side in ours-a every-a every-b ours-b; do
     rows=default; [ $side = ours-a ] && rows=default,dali-wds
     case $side in every*) export NVIMGCODEC_EXTENSIONS_PATH=$EVERY ;; *) unset NVIMGCODEC_EXTENSIONS_PATH ;; esac
     echo "== $side"; tag=$side ROWS=$rows regime thumb resnet50 64 150 30 0.9:4 '' 200
   done ;;
8) ROWS=default,dali-wds regime phone none 224 16 8 0.9:4 '' 300 ;;
esac
