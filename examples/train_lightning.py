"""fastfeed.Loader as the training data of a PyTorch Lightning 2.x `Trainer` (single GPU or DDP).

    python examples/train_lightning.py /data/packed/train --devices 8

Run on the project's H200 box with Lightning 2.6.6 (2 epochs, 1,024 demo images, DALI absent there so the CPU
decoders fed the GPU; `bash benchmarks/h200/lightning_check.sh`), 2026-11-29. Lightning is not a dependency of
fastfeed and CI does not run this file; the Loader-specific parts are the same as in the tested train_plain.py.

How it fits: the Loader is an iterable with `__len__`, returned from `train_dataloader()` (called in every DDP
process after the process group exists, so the Loader picks up its rank). `use_distributed_sampler=False` because
the Loader shards by rank itself; each new iteration (each Lightning epoch) advances the Loader's epoch. Batches
are already on the rank's GPU, so Lightning's transfer is a no-op. The Loader's position is stored in Lightning's
checkpoint, so resuming with `ckpt_path=` continues with the batches that were left.
"""
from __future__ import annotations

import argparse

import lightning as L
import torch
import torch.nn.functional as F
import torchvision

import fastfeed


class Classifier(L.LightningModule):
    def __init__(self, data: str, arch: str = "resnet50", batch_size: int = 256, image_size: int = 224,
                 lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        with fastfeed.open_dataset(data) as ds:
            num_classes = len(ds.classes)
        self.model = torchvision.models.__dict__[arch](num_classes=num_classes)
        self.loader: fastfeed.Loader | None = None
        self._loader_state: dict | None = None

    def train_dataloader(self):
        if self.loader is None:
            self.loader = fastfeed.Loader(self.hparams.data, batch_size=self.hparams.batch_size, train=True,
                                          image_size=self.hparams.image_size, seed=0)
        if self._loader_state is not None:
            self.loader.load_state_dict(self._loader_state)
            self._loader_state = None
        return self.loader

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self.model(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=1e-4)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.loader is not None:
            checkpoint["fastfeed_loader"] = self.loader.state_dict()  # small JSON-able dict

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._loader_state = checkpoint.get("fastfeed_loader")  # applied when the loader is created

    def on_train_end(self) -> None:
        if self.loader is not None:
            self.loader.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--ckpt-path", default=None, help="resume from a Lightning checkpoint")
    args = p.parse_args()
    accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    trainer = L.Trainer(accelerator=accelerator, devices=args.devices, max_epochs=args.epochs,
                        strategy="ddp" if args.devices > 1 else "auto", precision="bf16-mixed",
                        use_distributed_sampler=False)
    trainer.fit(Classifier(args.data), ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
