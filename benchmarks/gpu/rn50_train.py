"""A plain ResNet-50 training script, the kind `fastfeed profile` is for (run.sh's `profile` step profiles it):

    python rn50_train.py --images DIR [--workers 2] [--steps 80]     # torchvision ImageFolder + DataLoader
    python rn50_train.py --packed DIR [--steps 80]                   # fastfeed.Loader with its defaults

bf16 autocast, channels_last, batch 256, SGD; prints images/s over the steps after the first 20. Nothing in it
knows about the profiler.
"""
import argparse
import time

import torch
import torchvision


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--images", default=None)
    p.add_argument("--packed", default=None)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args()
    if args.images:
        import torchvision.transforms as T

        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                        T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
        data = torchvision.datasets.ImageFolder(args.images, tf)
        loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                             num_workers=args.workers, pin_memory=True, persistent_workers=True)
    else:
        import fastfeed

        loader = fastfeed.Loader(args.packed, batch_size=args.batch_size, dtype=torch.bfloat16, channels_last=True)
    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step, t0 = 0, None
    while step < args.steps:
        for images, labels in loader:
            images = images.cuda(non_blocking=True).to(memory_format=torch.channels_last)
            labels = labels.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step == 20:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            if step == args.steps:
                break
    torch.cuda.synchronize()
    rate = (args.steps - 20) * args.batch_size / (time.perf_counter() - t0)
    print(f"rn50_train: {'DataLoader' if args.images else 'fastfeed'}: {rate:.1f} images/s over steps 21-{args.steps}")


if __name__ == "__main__":
    main()
