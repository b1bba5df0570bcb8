"""OpenCLIP (open_clip_torch 3.3) contrastive image-text training on adopted WebDataset shards, launched by
tests/test_frameworks_openclip.py on the CPU:

    python tests/clients/openclip_train.py --train SHARDS_DS --out OUT [--save-at 3] [--resume OUT/ckpt.pt]

The part between the recipe markers is docs/recipes.md's OpenCLIP recipe, verbatim (tests/test_frameworks_readme.py
checks that): a Loader with `fields=["txt"]` on shards `fastfeed index` adopted, OpenCLIP's normalisation, its
bundled tokenizer on each batch's captions and its ClipLoss, where OpenCLIP's own trainer uses `get_wds_dataset`.
The model is a tiny ViT built from a config (no weights are downloaded); the loop is one intra-op thread and
seeded, so a run resumed from a checkpoint reproduces the uninterrupted run's losses bit for bit.

OUT/{tag}.json records every step: the global step, the batch's captions, a hash of its image bytes and the loss.
`--save-at S` writes OUT/ckpt.pt (model, optimizer, `loader.state_dict()`) after step S; `--resume` starts from it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import open_clip
import torch

import fastfeed

TINY = {"embed_dim": 32, "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2}}


class Probe:
    """The test's recording and checkpointing (the `probe.` lines are not part of the recipe in docs/recipes.md)."""

    def __init__(self, out: Path, save_at: int | None, resume: str | None):
        self.out, self.save_at, self.resume_from = out, save_at, resume
        self.steps, self.step_count = [], 0

    def resume(self, model, optimizer, loader) -> None:
        if self.resume_from:
            ckpt = torch.load(self.resume_from, weights_only=True)
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            loader.load_state_dict(json.loads(ckpt["loader"]))
            self.step_count = ckpt["step"]

    def step(self, epoch, batch, loss, model, optimizer, loader) -> None:
        self.step_count += 1
        self.steps.append({"step": self.step_count, "epoch": epoch, "txt": batch["txt"], "loss": loss.item(),
                           "images": hashlib.sha256(batch["images"].numpy().tobytes()).hexdigest()[:24]})
        if self.step_count == self.save_at:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "loader": json.dumps(loader.state_dict()), "step": self.step_count}, self.out / "ckpt.pt")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--train", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tag", default="run")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--save-at", type=int, default=None)
    p.add_argument("--resume", default=None)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    (out / "tiny-clip.json").write_text(json.dumps(TINY))
    open_clip.add_model_config(out / "tiny-clip.json")  # registers "tiny-clip"
    probe = Probe(out, args.save_at, args.resume)

    # --- recipe: openclip ---
    model = open_clip.create_model("tiny-clip", output_dict=True)   # no weights, as in create_model_and_transforms
    tokenizer = open_clip.get_tokenizer("tiny-clip")
    loss_fn = open_clip.ClipLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = fastfeed.Loader(args.train, batch_size=args.batch_size, train=True,
                             image_size=model.visual.image_size[0], fields=["txt"],
                             mean=open_clip.OPENAI_DATASET_MEAN, std=open_clip.OPENAI_DATASET_STD)
    probe.resume(model, optimizer, loader)
    for epoch in range(loader.epoch, args.epochs):
        loader.set_epoch(epoch)
        for batch in loader:   # dict: images [B,3,S,S] on this rank's GPU (else the CPU), txt: list[str]
            texts = tokenizer(batch["txt"]).to(batch["images"].device)
            features = model(batch["images"], texts)
            loss = loss_fn(features["image_features"], features["text_features"], features["logit_scale"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            probe.step(epoch, batch, loss, model, optimizer, loader)
    # --- end recipe ---

    loader.close()
    (out / f"{args.tag}.json").write_text(json.dumps(probe.steps))


if __name__ == "__main__":
    main()
