"""Pieces shared by the framework client scripts (tests/clients/*.py) and the tests that launch them.

The clients are real training programs; only what they have in common lives here: a tiny image tree packed by the
real CLI, a model small enough for a 2-core CI machine, and fingerprints that identify a batch (or one sample of
an eval batch) by its bytes, so a test can compare what two runs fed the model without trusting the Loader's
own bookkeeping.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import socket
from pathlib import Path

import numpy as np

TINY_CLASSES = 4


def free_port() -> int:
    """A loopback TCP port nobody listens on now (for a process group's rendezvous or a local server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client_parser(batch_size: int) -> argparse.ArgumentParser:
    """The arguments every client script takes; each adds its own."""
    p = argparse.ArgumentParser()
    p.add_argument("--train", required=True)
    p.add_argument("--val", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tag", default="run")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--image-size", type=int, default=32)
    return p


def make_tiny_tree(root: Path, num_images: int, num_classes: int = TINY_CLASSES, seed: int = 0,
                   sides: tuple[int, int] = (40, 80)) -> Path:
    """An ImageFolder tree of small distinct JPEGs (by default 40-80 px sides, ~2 KB): decoding costs next to
    nothing, so tests measure the framework integration, not the CPU. Larger `sides` make photos, which `auto`
    decodes on the GPU (tests/test_gpu_frameworks.py)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    root = Path(root)
    for i in range(num_images):
        w, h = (int(v) for v in rng.integers(sides[0], sides[1] + 1, size=2))
        # Smooth gradients plus noise: every image differs, and JPEG keeps the differences.
        yy, xx = np.mgrid[0:h, 0:w]
        base = rng.uniform(0, 255, size=3)
        slope = rng.uniform(-3, 3, size=(2, 3))
        img = base + xx[..., None] * slope[0] + yy[..., None] * slope[1] + rng.normal(0, 12, size=(h, w, 3))
        folder = root / f"class_{i % num_classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(folder / f"img_{i:05d}.jpg", quality=90)
    return root


def pack(src: Path, out: Path, fmt: str, shard_size: str = "24KB") -> Path:
    """`fastfeed pack` through the CLI's entry point, in the test process (tests/conftest.py's `run_pack`; small wds
    shards so order="shard" has several to shuffle). Only the tests call it, never a client script."""
    from conftest import run_pack

    run_pack(src, out, "--format", fmt, *(["--shard-size", shard_size] if fmt == "wds" else []))
    return Path(out)


def batch_digest(images, labels) -> dict:
    """What a batch fed the model: its labels and a hash of its exact image bytes (CPU tensors)."""
    images = images.detach().to("cpu").contiguous()
    return {"labels": labels.detach().to("cpu").tolist(),
            "images": hashlib.sha256(images.numpy().tobytes()).hexdigest()[:24]}


def row_fingerprints(images) -> list[str]:
    """One hash per sample of a batch. In eval mode (train=False) a sample's pixels depend only on its stored
    bytes, so the hash names the sample: two eval runs can be compared sample by sample."""
    images = images.detach().to("cpu").contiguous()
    return [hashlib.sha256(row.numpy().tobytes()).hexdigest()[:24] for row in images]


def row_signatures(images) -> list[list[float]]:
    """Per sample, its mean over each quarter of the image, per channel (12 numbers): names a sample when its
    pixels are only known within a tolerance (the GPU decoders, which the decode contract allows to differ from the
    CPU path by a fraction of a grey level, and the hybrid, whose parts differ from each other by as much)."""
    import torch

    pooled = torch.nn.functional.adaptive_avg_pool2d(images.detach().float(), 2)
    return [[round(v, 4) for v in row] for row in pooled.flatten(1).to("cpu").tolist()]


def row_fingerprint_ints(images):
    """`row_fingerprints` as an int64 tensor (56-bit), for collectives that only take tensors."""
    import torch

    return torch.tensor([int(h[:14], 16) for h in row_fingerprints(images)], dtype=torch.int64)


def tiny_net(num_classes: int):
    """A 2-layer convnet: small enough that a step costs milliseconds on a CPU."""
    import torch.nn as nn

    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(8, num_classes))


def write_json(path: Path, obj) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def client_env(**extra: str) -> dict:
    """The environment for a client script: this fastfeed checkout first on PYTHONPATH (a launched process must
    import the fastfeed under test, not an installed one), plus `extra`."""
    import os

    import fastfeed

    paths = [str(Path(fastfeed.__file__).resolve().parent.parent)]
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}
