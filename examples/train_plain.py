"""Train an image classifier on a packed dataset with fastfeed.Loader in a plain PyTorch loop (one process).

    fastfeed pack /data/imagenet/train /data/packed/train
    python examples/train_plain.py /data/packed/train --epochs 90 --batch-size 256
    python examples/train_plain.py /data/packed/train --resume ckpt.pt   # continues mid-epoch, exactly

On a machine without a GPU it runs on the CPU decoders (try --image-size 64 --arch resnet18 on the demo data:
`fastfeed demo-data demo/ && fastfeed pack demo/ demo-packed/`).
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
import torchvision

import fastfeed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data", help="a folder written by `fastfeed pack`")
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--checkpoint", default="ckpt.pt", help="written every --save-every steps and at each epoch end")
    p.add_argument("--save-every", type=int, default=1000)
    p.add_argument("--resume", default=None, help="a checkpoint written by this script")
    args = p.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = fastfeed.Loader(args.data, batch_size=args.batch_size, train=True, image_size=args.image_size,
                             device=device, channels_last=True, seed=0)
    model = torchvision.models.__dict__[args.arch](num_classes=len(loader.dataset.classes))
    model = model.to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    autocast = torch.autocast(device_type=device, dtype=torch.bfloat16)

    if args.resume:
        ckpt = torch.load(args.resume, map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])  # small JSON-able dict: which batches of which epoch remain

    def save() -> None:
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "loader": loader.state_dict()}
        torch.save(state, args.checkpoint + ".tmp")
        os.replace(args.checkpoint + ".tmp", args.checkpoint)  # a crash mid-save keeps the previous checkpoint

    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)  # keeps a resumed state of this epoch: only the remaining batches run
        model.train()
        for step, (images, labels) in enumerate(loader):  # already on `device`, normalised, augmented
            with autocast:
                loss = F.cross_entropy(model(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if step % 100 == 0:
                print(f"epoch {epoch} step {step}/{len(loader)} loss {loss.item():.3f}", flush=True)
            if (step + 1) % args.save_every == 0:
                save()
        save()
        print(f"epoch {epoch} done: {loader.stats()['counters']}", flush=True)
    loader.close()


if __name__ == "__main__":
    main()
