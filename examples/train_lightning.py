"""fastfeed.Loader as the training data of a PyTorch Lightning 2.x `Trainer` (single GPU or DDP).

    python examples/train_lightning.py /data/packed/train --devices 8

Lightning is a dev dependency: CI runs tests/clients/lightning_train.py, whose Loader-specific parts are these, and
`pytest -m gpu` runs the same client on GPUs (tests/test_gpu_frameworks.py).

How it fits (the same as tests/clients/lightning_train.py, which CI runs on 1 and 2 processes): the Loader is returned
from `train_dataloader()` (called in every DDP process after the process group exists, so the Loader picks up its
rank), with `use_distributed_sampler=False` because the Loader shards by rank itself. Lightning calls
`loader.sampler.set_epoch(epoch)` each epoch, and stores the Loader's `state_dict()` in its checkpoints by itself,
so `--ckpt-path` resumes mid-epoch with exactly the batches that were left. Batches are already on the rank's GPU,
so Lightning's transfer is a no-op.
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

    def train_dataloader(self):
        return fastfeed.Loader(self.hparams.data, batch_size=self.hparams.batch_size, train=True,
                               image_size=self.hparams.image_size)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        loss = F.cross_entropy(self.model(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9, weight_decay=1e-4)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--batch-size", type=int, default=256, help="per rank")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--ckpt-path", default=None, help="resume from a Lightning checkpoint")
    args = p.parse_args()
    accelerator = "gpu" if torch.cuda.is_available() else "cpu"
    trainer = L.Trainer(accelerator=accelerator, devices=args.devices, max_epochs=args.epochs,
                        strategy="ddp" if args.devices > 1 else "auto", precision="bf16-mixed",
                        use_distributed_sampler=False)
    model = Classifier(args.data, arch=args.arch, batch_size=args.batch_size, image_size=args.image_size)
    trainer.fit(model, ckpt_path=args.ckpt_path)


if __name__ == "__main__":
    main()
