"""Hugging Face Accelerate 1.15 training and evaluation with fastfeed.Loader, launched by
tests/test_frameworks_accelerate.py on 2 CPU processes:

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 tests/clients/accelerate_train.py \
        --train T --val V --out OUT [--save-every 3] [--resume OUT/step_3]

The part between the recipe markers is docs/recipes.md's Accelerate recipe, verbatim (tests/test_frameworks_readme.py
checks that), written like Accelerate's own examples: the Loaders go through `accelerator.prepare` with the rest
(which leaves them as they are: they already shard by rank and put batches on the device), the train Loader is
registered for checkpointing so `save_state`/`load_state` carry its position, and the eval loop counts with
`gather_for_metrics`, which drops the padding that evens out the ranks.

Each rank writes OUT/{tag}-rank{r}.json: every training batch (global step, labels, hash of the image bytes), per
epoch what `gather_for_metrics` returned (labels and one fingerprint per sample, rank 0's view) and the learning
rate schedule's final step.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator

import fastfeed
from common import batch_digest, client_parser, row_fingerprint_ints, tiny_net, write_json


class Probe:
    """The test's recording (the `probe.` lines are not part of the recipe in docs/recipes.md)."""

    def __init__(self):
        self.record = {"train": [], "eval": {}}
        self._rows, self._labels = [], []

    def train_batch(self, step, epoch, images, labels):
        self.record["train"].append({"step": step, "epoch": epoch, **batch_digest(images, labels)})

    def eval_batch(self, accelerator, images, gathered_labels):
        # A second gather_for_metrics on the same batch is trimmed the same way as the recipe's.
        rows = accelerator.gather_for_metrics(row_fingerprint_ints(images))
        assert len(rows) == len(gathered_labels)
        self._rows += rows.tolist()
        self._labels += gathered_labels.tolist()

    def eval_end(self, epoch, count):
        self.record["eval"][epoch] = {"count": count, "labels": self._labels, "rows": self._rows}
        self._rows, self._labels = [], []


def main() -> None:
    p = client_parser(batch_size=4)
    p.add_argument("--save-every", type=int, default=1000, help="save_state every N global steps")
    p.add_argument("--resume", default=None, help="a folder written by save_state, named step_N")
    args = p.parse_args()
    out = Path(args.out)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    probe = Probe()
    with fastfeed.open_dataset(args.train) as ds:
        num_classes = len(ds.classes)

    # --- recipe: accelerate ---
    accelerator = Accelerator()
    train_loader = fastfeed.Loader(args.train, batch_size=args.batch_size, train=True, image_size=args.image_size)
    eval_loader = fastfeed.Loader(args.val, batch_size=args.batch_size, train=False, image_size=args.image_size)
    model = tiny_net(num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    # len(train_loader) is this process's batches per epoch (a DataLoader's len is that only after prepare()),
    # and a prepared scheduler steps num_processes times per optimizer step: size it for all processes.
    total_steps = len(train_loader) * args.epochs * accelerator.num_processes
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total_steps)
    model, optimizer, train_loader, eval_loader, scheduler = accelerator.prepare(
        model, optimizer, train_loader, eval_loader, scheduler)
    accelerator.register_for_checkpointing(train_loader)  # its position goes into save_state()

    step = 0
    if args.resume:
        accelerator.load_state(args.resume)  # the Loader continues with the batches that were left
        step = int(Path(args.resume).name.removeprefix("step_"))
    for epoch in range(step // len(train_loader), args.epochs):
        model.train()
        for images, labels in train_loader:
            probe.train_batch(step, epoch, images, labels)
            loss = F.cross_entropy(model(images), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % args.save_every == 0:
                accelerator.save_state(Path(args.out) / f"step_{step}")

        model.eval()
        correct = count = 0
        for images, labels in eval_loader:
            with torch.no_grad():
                preds = model(images).argmax(dim=1)
            preds, labels = accelerator.gather_for_metrics((preds, labels))  # drops the ranks' padding
            probe.eval_batch(accelerator, images, labels)
            valid = labels != fastfeed.IGNORE_INDEX  # all True, unless a corrupt sample was replaced
            correct += int((preds == labels)[valid].sum())
            count += int(valid.sum())
        accelerator.print(f"epoch {epoch}: accuracy {correct / count:.3f} on {count} samples")
        probe.eval_end(epoch, count)
    # --- end recipe ---

    probe.record.update(lr_steps=scheduler.scheduler.last_epoch, total_steps=total_steps,
                        final_lr_factor=scheduler.scheduler.get_last_lr()[0] / 0.05,
                        world_size=accelerator.num_processes)
    write_json(out / f"{args.tag}-rank{accelerator.process_index}.json", probe.record)
    accelerator.end_training()


if __name__ == "__main__":
    main()
