"""Data-parallel training with torchrun: every rank reads its own equal share of each epoch through fastfeed.Loader.

    torchrun --nproc-per-node 8 examples/train_ddp.py /data/packed/train --epochs 90
    torchrun --nproc-per-node 8 examples/train_ddp.py /data/packed/train --resume ckpt.pt
    torchrun --nproc-per-node 4 examples/train_ddp.py /data/packed/train --resume ckpt.pt   # elastic: fewer GPUs

The Loader takes rank, world size and local GPU from the initialised process group / torchrun's environment, so
no DistributedSampler is needed; every rank gets the same number of batches, so no rank waits at an epoch end.
Without GPUs it runs on the CPU with the gloo backend (tests/ddp_train.py is a tested miniature of this script).
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP

import fastfeed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--checkpoint", default="ckpt.pt")
    p.add_argument("--save-every", type=int, default=1000)
    p.add_argument("--resume", default=None)
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")

    loader = fastfeed.Loader(args.data, batch_size=args.batch_size, train=True, image_size=args.image_size,
                             device=device, channels_last=True, seed=0)  # same seed on every rank
    model = torchvision.models.__dict__[args.arch](num_classes=len(loader.dataset.classes))
    model = DDP(model.to(device, memory_format=torch.channels_last), device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr * dist.get_world_size(), momentum=0.9, weight_decay=1e-4)

    if args.resume:
        ckpt = torch.load(args.resume, map_location=device, weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        # The loader state is the same on every rank and loads at any world size: the remaining samples of the
        # interrupted epoch are then split over the ranks that are here now, each read exactly once.
        loader.load_state_dict(ckpt["loader"])

    def save() -> None:
        state = loader.state_dict()  # every rank calls it; rank 0 writes (the states are equal)
        if dist.get_rank() == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "loader": state},
                       args.checkpoint + ".tmp")
            os.replace(args.checkpoint + ".tmp", args.checkpoint)
        dist.barrier()

    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)
        model.train()
        for step, (images, labels) in enumerate(loader):
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if dist.get_rank() == 0 and step % 100 == 0:
                print(f"epoch {epoch} step {step}/{len(loader)} loss {loss.item():.3f}", flush=True)
            if (step + 1) % args.save_every == 0:
                save()
        save()
    loader.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
