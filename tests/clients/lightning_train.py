"""PyTorch Lightning 2.6 training with fastfeed.Loader as the train and val data, launched by
tests/test_frameworks_lightning.py (1 process, or `--devices 2` for DDP on the CPU with gloo: Lightning re-launches
this script for rank 1).

    python tests/clients/lightning_train.py --train T --val V --out OUT [--devices 2] [--ckpt-path CKPT]

The part between the recipe markers is docs/recipes.md's Lightning recipe, verbatim (tests/test_frameworks_readme.py
checks that): a LightningModule whose dataloader hooks return Loaders, and `use_distributed_sampler=False`.
Everything else records what the model was fed, for the test to compare runs: OUT/{tag}-rank{r}.json holds every
training batch (global step, labels, hash of the image bytes) and every validation batch outside the sanity check
(labels and one hash per sample), plus the validation count Lightning aggregated over the ranks.
"""
from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

import fastfeed
from common import batch_digest, client_parser, row_fingerprints, row_signatures, tiny_net, write_json


# --- recipe: lightning ---
class Classifier(L.LightningModule):
    def __init__(self, train_path: str, val_path: str, batch_size: int = 256, image_size: int = 224,
                 num_classes: int = 1000):
        super().__init__()
        self.save_hyperparameters()
        self.model = tiny_net(num_classes)

    def train_dataloader(self):  # called in every DDP process: the Loader takes its rank from there
        return fastfeed.Loader(self.hparams.train_path, batch_size=self.hparams.batch_size, train=True,
                               image_size=self.hparams.image_size)

    def val_dataloader(self):
        return fastfeed.Loader(self.hparams.val_path, batch_size=self.hparams.batch_size, train=False,
                               image_size=self.hparams.image_size)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return F.cross_entropy(self.model(images), labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        logits = self.model(images)
        valid = labels != fastfeed.IGNORE_INDEX  # False only where a rank's share was padded (or a bad sample)
        self.log("val_loss", F.cross_entropy(logits, labels), sync_dist=True)  # skips IGNORE_INDEX (-100)
        self.log("val_correct", (logits.argmax(1) == labels).sum().float(), reduce_fx="sum", sync_dist=True)
        self.log("val_count", valid.sum().float(), reduce_fx="sum", sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def make_trainer(devices: int, max_epochs: int, **kw) -> L.Trainer:
    # use_distributed_sampler=False: the Loader already gives each rank its share (Lightning would otherwise try to
    # wrap it in a DistributedSampler). Its position goes into Lightning's checkpoints by itself (it has
    # state_dict/load_state_dict), so fit(ckpt_path=...) resumes mid-epoch exactly.
    return L.Trainer(devices=devices, strategy="ddp" if devices > 1 else "auto", max_epochs=max_epochs,
                     use_distributed_sampler=False, **kw)
# --- end recipe ---


class Recorder(L.Callback):
    """What the model was fed, batch by batch."""

    def __init__(self):
        self.train, self.val, self.val_counts = [], [], {}
        self.decoders, self.device = {}, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.train.append({"step": trainer.global_step, "epoch": trainer.current_epoch, "batch_idx": batch_idx,
                           **batch_digest(*batch), "sigs": row_signatures(batch[0])})
        self.device = str(batch[0].device)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            images, labels = batch
            self.val.append({"epoch": trainer.current_epoch, "batch_idx": batch_idx, "labels": labels.tolist(),
                             "rows": row_fingerprints(images), "sigs": row_signatures(images)})

    def on_fit_end(self, trainer, pl_module):  # which decoder `auto` chose for each Loader, and what it decoded
        for name, loader in (("train", trainer.train_dataloader), ("val", trainer.val_dataloaders)):
            self.decoders[name] = {"kind": loader.settings.decoder, "counters": loader.stats()["counters"]}

    def on_validation_end(self, trainer, pl_module):  # after Lightning summed val_count over batches and ranks
        if not trainer.sanity_checking and "val_count" in trainer.callback_metrics:
            self.val_counts[trainer.current_epoch] = float(trainer.callback_metrics["val_count"])


def main() -> None:
    p = client_parser(batch_size=8)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--ckpt-every", type=int, default=0, help="ModelCheckpoint every N training steps")
    p.add_argument("--ckpt-path", default=None, help="resume from this Lightning checkpoint")
    args = p.parse_args()
    out = Path(args.out)
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)

    recorder = Recorder()
    callbacks = [recorder]
    if args.ckpt_every:
        callbacks.append(L.pytorch.callbacks.ModelCheckpoint(
            dirpath=out / "ckpt", filename="{step}", every_n_train_steps=args.ckpt_every, save_top_k=-1))
    trainer = make_trainer(args.devices, args.epochs, callbacks=callbacks, default_root_dir=out, logger=False,
                           enable_checkpointing=bool(args.ckpt_every), enable_progress_bar=False,
                           enable_model_summary=False)
    with fastfeed.open_dataset(args.train) as ds:
        num_classes = len(ds.classes)
    model = Classifier(args.train, args.val, batch_size=args.batch_size, image_size=args.image_size,
                       num_classes=num_classes)
    trainer.fit(model, ckpt_path=args.ckpt_path)
    write_json(out / f"{args.tag}-rank{trainer.global_rank}.json",
               {"train": recorder.train, "val": recorder.val, "val_counts": recorder.val_counts,
                "world_size": trainer.world_size, "decoders": recorder.decoders, "device": recorder.device})


if __name__ == "__main__":
    main()
