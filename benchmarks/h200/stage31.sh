#!/usr/bin/env bash
# Issue 14, fourteenth session (2026-12-01), on one nvidia-h200: does the training step, launch-bound on a busy host,
# train faster when the loader's threads run at a lower CPU priority (nice)? And photos between ImageNet size and 1 MP
# (no row yet: the large-photo setting starts at 1 MP, ImageNet-like photos keep hw 1.0 and 2 threads).
#   bash benchmarks/h200/stage31.sh K     K = 1..4: staging (stage15.sh's: DALI's parts, the native build, the
#                                                    ImageNet-like set in 1; the CPU's topology printed)
#                                          2: also the sets in SETS2 (default: thumb; 20k thumbnails)
#                                          3: also the sets in SETS3 (default: half; 4k photos of ~0.55 MP)
#                                          5: DALI installed, tests/test_gpu.py unless TESTS=0
#                                          6: ImageNet-like, ResNet-18 and -50: the defaults, the loader's threads at
#                                             nice 10 (all / all but the Python ones), DALI's two readers
#                                          7: thumbnails (64 px crops) beside ResNet-50, the same nice rows and the GPU
#                                             decode; photos of ~0.55 MP alone and beside ResNet-50: the defaults,
#                                             the large-photo setting (hw 0.9, 4 threads), DALI, the DataLoader
# Round 2 (the ring reads on into the next epoch without the pipelines draining: PrefetchRing.extend), SETS3="half mid"
# in 3, the tree before it (84a4a5c, carried as .carry/old/tree-84a4a5c.tar.gz, with this tree's native build: its
# start() is unchanged) unpacked in 5:
#                                          8: the loader alone, this tree and the old one ABBA, with DALI's reader:
#                                             photos of ~0.55 MP (15 batches an epoch), of ~2.5 MP (8), ImageNet-like
#                                             (78), thumbnails (78); the tables in one archive
#                                          9: training, this tree and the old one ABBA: ResNet-18 on ImageNet-like
#                                             photos, ResNet-50 on the ~0.55-MP ones
# TAG names the JSON. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2]
# (round 2: and .carry/old), K=6.. [].
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
case $K in
1) lscpu | grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\)|CPU\(s\))"
   exec bash benchmarks/h200/stage15.sh 1 ;;
4) exec bash benchmarks/h200/stage15.sh 4 ;;
2) stage_with_sets 2 "${SETS2-thumb}"; exit 0 ;;
3) stage_with_sets 3 "${SETS3-half}"; exit 0 ;;
esac
source benchmarks/h200/lib.sh
tag=${TAG:-a}
NICE='nice10=dict(_nice=10);nice10 py0=dict(_nice="10,py")'
OLD=/tmp/old
abba() {  # $1 = set, $2 = consumers, $3 = name, rest: train_table.py arguments; this tree and the old one, ABBA
  local set=$1 consumers=$2 name=$3; shift 3
  local data=(--data $W/$set-wds --images $W/$set-images --rows default --label $set)
  table $PWD $name-new-a $consumers "${data[@]}" "$@"; table $OLD $name-old-a $consumers "${data[@]}" "$@"
  table $OLD $name-old-b $consumers "${data[@]}" "$@"; table $PWD $name-new-b $consumers "${data[@]}" "$@"
}
case $K in
5) install_dali
   if [ -e .carry/old ]; then
     rm -rf $OLD && mkdir -p $OLD && tar -xzf .carry/old/tree-84a4a5c.tar.gz -C $OLD \
         && cp /tmp/ffnative/_native*.so $OLD/fastfeed/ && echo "old tree: $(ls $OLD)"
   fi
   if [ "${TESTS:-1}" = 1 ]; then gpu_tests; fi ;;
6) table $PWD r18-r50-$tag resnet18,resnet50 --max-warmup 500 --extra-ff "$NICE" ;;
7) ROWS=default,dali-wds regime thumb resnet50 64 150 30 0.9:4 \
       "$NICE;gpu=dict(decoder=\"dali\");gpu nice10=dict(decoder=\"dali\", _nice=10)" 300
   regime half none,resnet50 224 50 10 0.9:4,1.0:2 'hw09t4=dict(hw_decoder_load=0.9, num_threads=4)' 280 ;;
8) abba half none alone-half --steps 150 --warmup 50 --max-warmup 400
   abba mid none alone-mid --steps 40 --warmup 20 --max-warmup 100
   abba base none alone-base --steps 150 --warmup 50 --max-warmup 400
   abba thumb none alone-thumb --steps 150 --warmup 50 --max-warmup 400 --image-size 64
   for set in half mid base thumb; do
     ROWS=dali-wds regime $set none $([ $set = thumb ] && echo 64 || echo 224) 100 20 0.9:4,1.0:2 '' 120
   done
   tar czf $OUT/alone-$tag.tgz -C $OUT $(cd $OUT && ls table-*.json) && rm -f $OUT/table-*.json ;;
9) abba base resnet18 r18 --max-warmup 500
   abba half resnet50 r50-half --steps 60 --warmup 20 --max-warmup 200
   tar czf $OUT/train-$tag.tgz -C $OUT $(cd $OUT && ls table-*.json) && rm -f $OUT/table-*.json ;;
esac
