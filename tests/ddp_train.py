"""A small DDP training run through fastfeed.Loader on the CPU (gloo), launched by tests/test_ddp.py via torchrun.

    python -m torch.distributed.run --standalone --nproc-per-node 4 tests/ddp_train.py --data DIR --out DIR
        [--exit-at-step S] [--resume CKPT_DIR]

Deterministic: fixed seeds, deterministic algorithms, one intra-op thread, gloo all-reduce (a fixed reduction
order for a fixed world size), so an interrupted-and-resumed run ends with the same weights as an uninterrupted one.

Each rank writes OUT/rank{r}.json: steps taken, and per epoch the sample ids it consumed. The Loader hands out
images, not ids, so ids come from `fastfeed.sampling.plan_epoch` with the Loader's own arguments and resume state;
the labels of every batch are checked against those ids' labels (`label_mismatches` must stay 0), which ties the
plan to what the Loader really delivered. Rank 0 also writes OUT/final.pt (the model's state_dict).

`--exit-at-step S`: after optimizer step S (global, counted across epochs) every rank saves a checkpoint to
OUT/ckpt/ (model, optimizer: rank0.pt; loader state: rank{r}.json, rank-local), meets the others at a barrier and
dies with os._exit(17): no clean shutdown, like a preempted job.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import fastfeed
from fastfeed import sampling

KILLED_EXIT_CODE = 17


class SmallNet(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exit-at-step", type=int, default=None)
    p.add_argument("--resume", default=None, help="a checkpoint folder written by --exit-at-step")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # rank/world_size come from torch.distributed: nothing passed explicitly.
    loader = fastfeed.Loader(args.data, batch_size=args.batch_size, train=True, image_size=args.image_size,
                             device="cpu", decoder="cpu", dtype=torch.float32, seed=args.seed, drop_last=True,
                             num_threads=1, reader_threads=1, prefetch=1)
    assert loader.world.rank == rank and loader.world.world_size == world
    # find_unused_parameters=True keeps DDP from rebuilding its gradient buckets after the first step: a rebuild
    # moves parameters within the all-reduce buffers, which changes float summation order, so a resumed run
    # (which rebuilds at its own first step) would drift from the uninterrupted one by an ulp.
    model = nn.parallel.DistributedDataParallel(SmallNet(len(loader.dataset.classes)), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    step, start_epoch = 0, 0
    log = {"rank": rank, "world_size": world, "epochs": {}, "steps": 0, "label_mismatches": 0, "resumed": False}
    if args.resume:
        ckpt = Path(args.resume)
        blob = torch.load(ckpt / "rank0.pt", weights_only=True)  # weights and optimizer: the same on every rank
        model.module.load_state_dict(blob["model"])
        opt.load_state_dict(blob["optimizer"])
        step = int(blob["step"])
        saved_world = int(blob["world_size"])
        # Rank-local loader state; at another world size any saved rank's state works (they are equal).
        loader.load_state_dict(json.loads((ckpt / f"rank{rank % saved_world}.json").read_text()))
        start_epoch = loader.epoch
        log["resumed"] = True

    labels_of = loader.dataset.labels
    for epoch in range(start_epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a loaded state for this epoch: the rest of it runs
        resume = loader.state_dict()["sampling"]
        plan = sampling.plan_epoch(len(loader.dataset), seed=args.seed, epoch=epoch, world=loader.world,
                                   batch_size=args.batch_size, drop_last=True, resume=resume)
        ids = log["epochs"].setdefault(str(epoch), [])
        model.train()
        for k, (images, labels) in enumerate(loader):
            batch_ids = plan.batch(k)
            if not np.array_equal(labels.numpy(), labels_of[batch_ids]):
                log["label_mismatches"] += 1
            ids.extend(int(i) for i in batch_ids)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(images), labels).backward()
            opt.step()
            step += 1
            log["steps"] += 1
            if args.exit_at_step is not None and step == args.exit_at_step:
                save_and_die(out, model, opt, loader, step, rank, world, log)
    (out / f"rank{rank}.json").write_text(json.dumps(log))
    if rank == 0:
        torch.save(model.module.state_dict(), out / "final.pt")
    loader.close()
    dist.barrier()
    dist.destroy_process_group()


def save_and_die(out: Path, model, opt, loader, step: int, rank: int, world: int, log: dict) -> None:
    ckpt = out / "ckpt"
    ckpt.mkdir(exist_ok=True)
    (ckpt / f"rank{rank}.json").write_text(json.dumps(loader.state_dict()))
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step,
                    "world_size": world}, ckpt / "rank0.pt")
    (out / f"rank{rank}.json").write_text(json.dumps(log))
    dist.barrier()  # every rank's files are on disk before anyone dies
    os._exit(KILLED_EXIT_CODE)


if __name__ == "__main__":
    main()
