#!/usr/bin/env bash
# Issue 14, eleventh session (2026-12-01), on one nvidia-h200: where the hybrid's CPU-share climber starts. The
# tenth session's best ResNet-50 state (one pipeline, 3/8 of each batch on the CPU: 2.7% over the ceiling, 1.02x
# DALI's reader) was found once in three rows: started at 0, the climber's 1/8 and 1/4 probes gain about 1% each,
# at its threshold. Rows: the defaults; the defaults with the climber started at 1/4 (as a DDP rank with 16 cores
# starts); one pipeline at fixed shares 1/4 and 3/8 (where a climber should end); DALI's file reader.
#   bash benchmarks/h200/stage27.sh K     K = 1..4 stage25.sh's staging (the 20k ImageNet-like set only)
#                                          5: DALI and Lightning installed; pytest -m gpu unless TESTS=0
#                                          6: ResNet-50, 7: ResNet-18, 8: ResNet-50 with the rows in another order
# Round 2 (the tree where a tuned GPU Loader starts with one pipeline, not two: its first batch comes 0.5-1 s sooner,
# rows 6-8): the defaults against the same tree started with two (`_first=2`: the tenth session's defaults).
#                                          9: ResNet-50, then ResNet-18; 10: the loader alone, then ResNet-50 again
#                                             with the rows in the other order
#                                          11: pytest -m gpu tests/test_gpu.py; fastfeed bench (none, resnet50)
# 150 warm-up + ${STEPS:-300} timed steps per row, every step kept (--per-step); TAG names the JSON.
# Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK], K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. [].
set -uo pipefail
K=$1; shift
case $K in
1|2|3|4) exec bash benchmarks/h200/stage25.sh $K ;;
esac
source benchmarks/h200/lib.sh
long="--per-step --warmup 150 --steps ${STEPS:-300} --rows dali-file"
tag=${TAG:-a}
s25='start25=dict(_start=0.25)'
p1s25='p1s25=dict(pipelines=1,_share=0.25)'
p1s38='p1s38=dict(pipelines=1,_share=0.375)'
case $K in
5) install_and_test ;;
6) table $PWD r50-$tag resnet50 $long --extra-ff "$s25;dflt=dict();$p1s38;$p1s25" ;;
7) table $PWD r18-$tag resnet18 $long --extra-ff "dflt=dict();$s25" ;;
8) table $PWD r50b-$tag resnet50 $long --extra-ff "dflt=dict();$p1s25;$p1s38;$s25" ;;
9) table $PWD r50-first-$tag resnet50 $long --extra-ff "dflt=dict();first2=dict(_first=2)"
   table $PWD r18-first-$tag resnet18 $long --extra-ff "dflt=dict();first2=dict(_first=2)" ;;
10) table $PWD alone-first-$tag none --per-step --warmup 200 --steps 200 --rows dali \
        --extra-ff "dflt=dict();first2=dict(_first=2)"
    table $PWD r50b-first-$tag resnet50 $long --extra-ff "first2=dict(_first=2);dflt=dict()"
    for p in "" 1 "" 1; do  # where the first batch's time goes: fresh processes, the tuned start and one fixed
      python3 benchmarks/h200/startup.py --data $W/base-wds ${p:+--pipelines $p} 2>&1 | quiet | grep -E "startup|  [0-9]"
    done ;;
11) # the final tree: the GPU tests, and `fastfeed bench` warming up until the pipeline tuner settles
    gpu_tests
    bench_rows none resnet50 ;;
esac
