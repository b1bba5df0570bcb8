# The image sets of the regime tables (stage30.sh, stage31.sh), sourced before staging: `mk SET` writes SET's images
# under $W/SET-images and packs them to $W/SET-wds; `stage_with_sets K "SETS"` runs staging step K, then mk for each;
# `staged K SETS2 SETS3` is a stage script's staging (stage40.sh on).
W=${W:-/tmp/ffbench}
mk() {  # $1 = set: its images and its webdataset shards
  local args
  case $1 in
  thumb) args="20000 --regime thumb" ;; png) args="4000 --regime png" ;; mixed) args="4000 --regime mixed" ;;
  half) args="4000 --short-side 560:820" ;; mid) args="2000 --short-side 1200:1800" ;;
  phone) args="512 --regime phone" ;;  # 12-MP photos, two batches an epoch
  *) echo "unknown set $1" >&2; return 1 ;;
  esac
  (export PYTHONPATH=/tmp/site:$PWD; cp /tmp/ffnative/_native*.so fastfeed/
   python3 tools/make_dataset.py $W/$1-images --num-images $args --num-classes 100 --seed 0 | tail -1
   python3 -m fastfeed.cli pack $W/$1-images $W/$1-wds --format wds --shard-size 256MB --jpeg keep \
       --shuffle-seed 0 --workers 16 --quiet --overwrite | tail -1)
}
stage_with_sets() {  # $1 = staging step (2 or 3), $2 = the sets to make after it
  local set
  bash benchmarks/h200/stage15.sh $1
  for set in $2; do time mk $set; done
}
staged() {  # $1 = a stage script's step K: steps 1..4 are stage31.sh's staging, run in the script's place (exec);
            # $2 / $3 = the sets steps 2 / 3 make unless SETS2 / SETS3 say. Later steps return to the script.
  case $1 in
  1|4) exec bash benchmarks/h200/stage31.sh $1 ;;
  2) SETS2=${SETS2-$2} exec bash benchmarks/h200/stage31.sh 2 ;;
  3) SETS3=${SETS3-$3} exec bash benchmarks/h200/stage31.sh 3 ;;
  esac
}
