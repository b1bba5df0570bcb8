"""DDP scaling of ResNet-50 (or --arch resnet18) training fed by fastfeed.Loader, one process per GPU.

    torchrun --nproc-per-node 1 benchmarks/gpu/ddp_scaling.py --data /tmp/ffbench/base-wds --json $OUT/ddp1.json
    torchrun --nproc-per-node 2 benchmarks/gpu/ddp_scaling.py --data /tmp/ffbench/base-wds --json $OUT/ddp2.json
Each rank: Loader(batch 256 per rank, float16, channels_last, rank/world from torchrun), ResNet-50 (torchvision),
bf16 autocast, SGD, DDP. Timed: --steps after --warmup, wall clock between two barriers with the GPUs synchronised;
images/s = steps * 256 * world / wall. Scaling = (2-GPU img/s) / (2 x 1-GPU img/s).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))  # dali_reference
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this tree's fastfeed


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--arch", default="resnet50", choices=["resnet50", "resnet18"])
    p.add_argument("--json", default=None)
    p.add_argument("--loader-kwargs", default="{}", help='extra Loader keywords as JSON, e.g. {"pipelines": 3}')
    p.add_argument("--loader", default="fastfeed", choices=["fastfeed", "dali-wds"],
                   help="dali-wds: DALI's webdataset reader over the same shards, tuned (dali_reference.py; "
                        "every rank reads all shards in its own random order: a throughput baseline, not a sharding)")
    p.add_argument("--dali-grid", default="1.0:4", help="hw_decoder_load:threads of the DALI reader")
    p.add_argument("--resident", action="store_true",
                   help="no loader: every step trains on one batch already on the GPU (the DDP ceiling)")
    p.add_argument("--bind", action="store_true",
                   help="run each rank on the cores of its GPU's NUMA node (what torchrun --numa-binding=node does, "
                        "without numactl), or on its 1/LOCAL_WORLD_SIZE of the cores where the host has one node")
    args = p.parse_args()
    import torchvision

    import fastfeed

    local = int(os.environ.get("LOCAL_RANK", "0"))
    binding = _bind(local) if args.bind else None  # before any other thread starts: they inherit the mask
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local)
    model = torchvision.models.__dict__[args.arch](num_classes=1000).to(dev).to(memory_format=torch.channels_last)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    dist.barrier()
    t0 = time.perf_counter()
    extra = json.loads(args.loader_kwargs)
    if args.loader == "fastfeed":
        loader = fastfeed.Loader(args.data, batch_size=args.batch_size, train=True, image_size=224, device=dev,
                                 dtype=torch.float16, channels_last=True, **extra)
    else:
        from dali_reference import DaliReference

        hw, threads = args.dali_grid.split(":")
        loader = DaliReference("webdataset", args.data, batch_size=args.batch_size, num_threads=int(threads),
                               device_id=local, hw_decoder_load=float(hw), image_size=224)
    it = iter(loader)
    if args.resident:  # the same first batch every step: what DDP alone scales to on this host
        resident = next(it)
        it = _repeat(resident)
    batch = next(it)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    waits, n, wall = [], 0, 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
        if step > 0:
            w0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                it = iter(loader)
                batch = next(it)
            if step >= args.warmup:
                waits.append(time.perf_counter() - w0)  # per step, kept: which steps wait says why
        x, y = batch
        x = x.contiguous(memory_format=torch.channels_last)  # a no-op for fastfeed (channels_last=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y % 1000)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            n += x.shape[0]
    torch.cuda.synchronize()
    dist.barrier()
    wall = time.perf_counter() - start
    local_res = torch.tensor([n, sum(waits), first], dtype=torch.float64, device=dev)
    gathered = [torch.zeros_like(local_res) for _ in range(world)]
    dist.all_gather(gathered, local_res)
    stats = loader.stats() if hasattr(loader, "stats") else {}
    info = stats.get("info", {})
    loader.close()
    if rank == 0:
        total = sum(int(g[0]) for g in gathered)
        res = {"world": world, "images_per_s": total / wall, "wall_s": wall, "steps": args.steps,
               "batch_per_rank": args.batch_size, "wait_fraction_per_rank": [float(g[1]) / wall for g in gathered],
               "first_batch_s_per_rank": [float(g[2]) for g in gathered],
               "waits_ms_rank0": [round(w * 1e3, 1) for w in waits],
               "settings_rank0": {k: info.get(k) for k in ("hw_decoder_load", "num_threads", "pipelines")},
               "pipeline_history_rank0": stats.get("pipeline_history"), "cpu_count": os.cpu_count(),
               "resident": args.resident, "arch": args.arch,
               "loader_kwargs": extra, "loader": args.loader, "binding_rank0": binding,
               "dali_grid": args.dali_grid if args.loader != "fastfeed" else None,
               "stats_rank0": json.loads(json.dumps(stats, default=str)),
               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": torch.cuda.get_device_name(0)}
        print(json.dumps(res))
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
    dist.destroy_process_group()
    return 0


def _bind(local: int) -> dict:
    """Restrict this process to its GPU's NUMA node's cores (sysfs), or to its 1/LOCAL_WORLD_SIZE of the cores where
    the node is unknown or the host has a single node; what was chosen."""
    props = torch.cuda.get_device_properties(local)
    bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    cores, node = sorted(os.sched_getaffinity(0)), -1
    try:
        node = int(Path(f"/sys/bus/pci/devices/{bus}/numa_node").read_text())
    except (OSError, ValueError):
        pass
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    if node >= 0 and len(nodes) > 1:
        mine = _cpulist(Path(f"/sys/devices/system/node/node{node}/cpulist").read_text())
        chosen = [c for c in cores if c in mine]
    else:
        n = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        chosen = cores[local * len(cores) // n:(local + 1) * len(cores) // n]
    os.sched_setaffinity(0, chosen)
    return {"gpu_bus": bus, "numa_node": node, "nodes": len(nodes), "cores": len(chosen)}


def _cpulist(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _repeat(batch):
    while True:
        yield batch


if __name__ == "__main__":
    sys.exit(main())
