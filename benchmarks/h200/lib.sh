# Shared by the third session's device rounds (stage18.sh, stage19.sh), sourced after staging: environment,
# log filter, and the DDP row. Expects W (data folder) and OUT (results folder).
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # KINDS.md: keep multicast off
cp /tmp/ffnative/_native*.so fastfeed/  # built by step 1 from this same tree (the carried tree replaces it)
quiet() { grep -v -iE "nvjpeg2k|nvtiff|^note:|Warning"; }
T=benchmarks/h200/train_table.py
ddp() {  # $1 = label, $2 = ranks, rest = extra args
  local label=$1 n=$2; shift 2
  timeout 120 torchrun --standalone --nproc-per-node $n benchmarks/h200/ddp_scaling.py --data $W/base-wds \
      --json $OUT/ddp-$label.json "$@" >$OUT/ddp-$label.log 2>&1
  python3 -c "import json; d=json.load(open('$OUT/ddp-$label.json')); w=d['waits_ms_rank0']; c=d.get('stats_rank0',{}).get('counters',{}); print('$label', round(d['images_per_s']), 'img/s, wait', [round(x,3) for x in d['wait_fraction_per_rank']], 'waits>10ms', sum(x>10 for x in w), 'of', len(w), 'first', [round(x,1) for x in d['first_batch_s_per_rank']], 'cpu share', round(c['cpu_decoded']/max(1,c['cpu_decoded']+c['gpu_decoded']),2) if 'cpu_decoded' in c else '-')" 2>&1 | tail -1
}
