#!/usr/bin/env bash
# Issue 14, for the twenty-second session (written 2026-12-02, not yet run), on one nvidia-h200:
# - the GPU tests on the twenty-first session's last code (thumbnails on the GPU under 8 cores, `86da610` on, were
#   not run on a device);
# - thumbnails under 8 cores now decode on the GPU, where ResNet-18 at 64 px trained at 0.89-0.91x DALI's reader
#   (15,175 against 16,586 img/s on 4 cores) with the same decoder: fastfeed ran one pipeline of 2 threads at
#   hw_decoder_load 1.0, DALI 4 threads at 0.9. Is it the threads, the share, or the pipelines?
# - the 8-core table again (CPU decode and the GPU pipeline past it), with DALI's reader in the same run.
#   bash benchmarks/h200/stage50.sh K     K = 1..4: staging as stage31.sh (SETS2 default: thumb; SETS3: none)
#                                          5: DALI and Lightning installed; the GPU tests unless TESTS=0
#                                          6: thumbnails (64 px) on cores 0-3: alone and beside ResNet-18: the
#                                             defaults, 4 threads, hw 0.9 + 4 threads, two fixed pipelines,
#                                             DALI's webdataset reader
#                                          7: the same on cores 0-7: the defaults, the GPU decode, DALI's reader,
#                                             beside ResNet-18 and -50
# TAG names the archive. Carry per call: K=1 [.carry/p1, .carry/x], K=2..4 [.carry/pK],
# K=5 [.carry/p5, .carry/x2, .carry/fw], K=6.. []. Each step packs $OUT into one archive (bundle_out, lib.sh).
set -uo pipefail
K=$1; shift
source benchmarks/h200/sets.sh
staged $K "thumb" ""
source benchmarks/h200/lib.sh
tag=${TAG:-a}
case $K in
5) install_and_test ;;
6) CORES=0-3 tag=cores4-$tag thumb_table none,resnet18 \
       't4=dict(num_threads=4);hw09t4=dict(hw_decoder_load=0.9, num_threads=4);p2=dict(pipelines=2)' ;;
7) CORES=0-7 tag=cores8-$tag thumb_table resnet18,resnet50 'gpu=dict(decoder="dali")' ;;
esac
[ $K -ge 5 ] && bundle_out stage50-$K-$tag
