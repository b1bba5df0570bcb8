"""A torchrun training script in the style of torchvision's references/classification/train.py, with
fastfeed.Loader in place of DataLoader + DistributedSampler; launched by tests/test_frameworks_torchvision.py:

    torchrun --standalone --nproc-per-node 2 tests/clients/torchvision_train.py --train T --val V --out OUT

What it keeps from the reference script, because real scripts do it: `init_distributed_mode` replaces
`builtins.print` (setup_for_distributed) before the loaders are built; MixUp/CutMix come from `get_mixup_cutmix`
(torchvision.transforms.v2) and go where the reference puts its collate_fn; the epoch loop calls
`train_sampler.set_epoch(epoch)`; `evaluate` all-reduces the number of samples it scored and compares it with
`len(data_loader.dataset)`. The only differences are in `load_data` (the Loader instead of DataLoader +
DistributedSampler) and in `evaluate`, which counts real samples with the IGNORE_INDEX mask (the DataLoader
version counts DistributedSampler's padded duplicates, and the reference script can only warn about it).

Each rank writes OUT/{tag}-rank{r}.json: the sampler's view per epoch, a digest of every training batch, and per
evaluation the all-reduced count and the fingerprints of the samples scored (gathered on every rank).
"""
from __future__ import annotations

import builtins
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torchvision.transforms import v2

import fastfeed
from common import batch_digest, client_parser, row_fingerprints, tiny_net, write_json


def setup_for_distributed(is_master):
    """Disables printing when not in the master process (as torchvision's references/classification/utils.py)."""
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"])
    else:
        print("Not using distributed mode")
        args.distributed = False
        return
    args.distributed = True
    args.dist_backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(args.gpu)
    print(f"| distributed init (rank {args.rank}): env://", flush=True)
    dist.init_process_group(backend=args.dist_backend, init_method="env://", world_size=args.world_size,
                            rank=args.rank)
    dist.barrier()
    setup_for_distributed(args.rank == 0)


def reduce_across_processes(val):
    if not (dist.is_available() and dist.is_initialized()):
        return torch.tensor(val)
    t = torch.tensor(val)
    dist.barrier()
    dist.all_reduce(t)
    return t


def get_mixup_cutmix(*, mixup_alpha, cutmix_alpha, num_classes):
    mixup_cutmix = []
    if mixup_alpha > 0:
        mixup_cutmix.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
    if cutmix_alpha > 0:
        mixup_cutmix.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
    if not mixup_cutmix:
        return None
    return v2.RandomChoice(mixup_cutmix)


# --- recipe: torchrun ---
def load_data(traindir, valdir, args, num_classes):
    mixup_cutmix = get_mixup_cutmix(mixup_alpha=args.mixup_alpha, cutmix_alpha=args.cutmix_alpha,
                                    num_classes=num_classes)
    # Replaces DataLoader(dataset, sampler=DistributedSampler(dataset), collate_fn=...): the Loader shards by
    # rank itself, and applies MixUp/CutMix per batch (deterministic per seed, epoch and batch: resume-exact).
    data_loader = fastfeed.Loader(traindir, batch_size=args.batch_size, train=True, image_size=args.image_size,
                                  num_workers=args.workers, pin_memory=True, batch_transform=mixup_cutmix)
    data_loader_test = fastfeed.Loader(valdir, batch_size=args.batch_size, train=False,
                                       image_size=args.image_size, num_workers=args.workers, pin_memory=True)
    return data_loader, data_loader_test, data_loader.sampler


def evaluate(model, criterion, data_loader, device):
    model.eval()
    num_processed_samples = correct = 0
    with torch.inference_mode():
        for image, target in data_loader:
            image, target = image.to(device, non_blocking=True), target.to(device, non_blocking=True)
            output = model(image)
            loss = criterion(output, target)  # CrossEntropyLoss skips IGNORE_INDEX (-100) targets
            valid = target != fastfeed.IGNORE_INDEX  # padding that evens out the ranks' shares: not a sample
            correct += int((output.argmax(1) == target)[valid].sum())
            num_processed_samples += int(valid.sum())
    num_processed_samples = int(reduce_across_processes(num_processed_samples))
    correct = int(reduce_across_processes(correct))
    if len(data_loader.dataset) != num_processed_samples:
        raise RuntimeError(f"the dataset has {len(data_loader.dataset)} samples, but {num_processed_samples} "
                           "were used for the validation")
    print(f"Test: Acc@1 {100 * correct / num_processed_samples:.3f} on {num_processed_samples} samples, "
          f"last loss {loss.item():.3f}")
    return num_processed_samples
# --- end recipe ---


def main() -> None:
    p = client_parser(batch_size=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--mixup-alpha", type=float, default=0.2)
    p.add_argument("--cutmix-alpha", type=float, default=1.0)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    original_print = builtins.print
    init_distributed_mode(args)
    device = torch.device("cuda", args.gpu) if torch.cuda.is_available() else torch.device("cpu")
    with fastfeed.open_dataset(args.train) as ds:
        num_classes = len(ds.classes)

    data_loader, data_loader_test, train_sampler = load_data(args.train, args.val, args, num_classes)
    model = tiny_net(num_classes).to(device)
    model = nn.parallel.DistributedDataParallel(model) if args.distributed else model
    criterion = nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    record = {"print_replaced": builtins.print is not original_print, "sampler": [], "train": [], "eval": []}
    for epoch in range(args.epochs):
        if args.distributed:
            train_sampler.set_epoch(epoch)
        ids = [int(i) for i in train_sampler]
        record["sampler"].append({"epoch": train_sampler.epoch, "len": len(train_sampler), "ids": ids,
                                  "num_replicas": train_sampler.num_replicas, "rank": train_sampler.rank})
        model.train()
        for image, target in data_loader:
            record["train"].append({"epoch": epoch, "target_shape": list(target.shape),
                                    **batch_digest(image, target)})
            loss = criterion(model(image), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        count = evaluate(model, criterion, data_loader_test, device)
        scored = []
        for image, target in data_loader_test:  # what was scored, sample by sample (for the test to check)
            scored += [(h, int(y)) for h, y in zip(row_fingerprints(image), target) if y != fastfeed.IGNORE_INDEX]
        gathered = [None] * args.world_size
        dist.all_gather_object(gathered, scored)
        record["eval"].append({"count": count, "scored": [s for part in gathered for s in part]})
    write_json(Path(args.out) / f"{args.tag}-rank{args.rank}.json", record)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
