"""MixUp/CutMix on fastfeed batches through `Loader(batch_transform=...)`: timm 1.0's `timm.data.Mixup` and
torchvision.transforms.v2 `MixUp`/`CutMix`, unchanged, as those libraries document them.

They draw their randomness from numpy's (timm) and torch's (torchvision) global generators; the Loader seeds both
from (seed, epoch, batch position) around each call and restores them afterwards, so the mixed batches are the
same in every run and after a mid-epoch resume, and the training program's own random stream is untouched.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from timm.data import Mixup
from torchvision.transforms import v2

import fastfeed
from clients.common import batch_digest, make_tiny_tree, pack
from resume_harness import run_test_save_load_state

N, CLASSES, BATCH, IMAGE_SIZE = 48, 4, 8, 32


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixup")
    return pack(make_tiny_tree(root / "src", N, CLASSES), root / "wds", "wds")


TRANSFORMS = {
    "timm-mixup-cutmix": lambda: Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, mode="batch",
                                       label_smoothing=0.1, num_classes=CLASSES),
    "timm-elementwise": lambda: Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, mode="elem", label_smoothing=0.1,
                                      num_classes=CLASSES),
    "tv-mixup": lambda: v2.MixUp(alpha=0.8, num_classes=CLASSES),
    "tv-cutmix": lambda: v2.CutMix(alpha=1.0, num_classes=CLASSES),
    "tv-random-choice": lambda: v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=CLASSES),
                                                 v2.CutMix(alpha=1.0, num_classes=CLASSES)]),
}


def make(path, transform=None, **kw):
    return fastfeed.Loader(path, batch_size=BATCH, train=True, image_size=IMAGE_SIZE, device="cpu", seed=11,
                           batch_transform=transform, **kw)


def epoch_digests(loader) -> list[dict]:
    return [batch_digest(images, labels) for images, labels in loader]


@pytest.mark.parametrize("name", TRANSFORMS)
def test_mixed_batches_have_soft_targets_and_mixed_pixels(path, name):
    plain = [(x.clone(), y.clone()) for x, y in make(path)]
    mixed = [(x.clone(), y.clone()) for x, y in make(path, TRANSFORMS[name]())]
    assert len(mixed) == len(plain) == N // BATCH
    smoothing = 0.1 if name.startswith("timm") else 0.0
    changed = 0
    for (xp, yp), (xm, ym) in zip(plain, mixed):
        assert xm.shape == xp.shape == (BATCH, 3, IMAGE_SIZE, IMAGE_SIZE) and xm.dtype == torch.float32
        assert ym.shape == (BATCH, CLASSES) and ym.dtype == torch.float32
        assert torch.allclose(ym.sum(dim=1), torch.ones(BATCH), atol=1e-5)
        assert float(ym.min()) >= smoothing / CLASSES - 1e-6
        # Each row's largest weight sits on a class of this batch: the targets were built from these labels.
        assert set(ym.argmax(dim=1).tolist()) <= set(yp.tolist())
        changed += int(not torch.equal(xm, xp))
    assert changed >= len(plain) - 1, "the transform left the pixels of most batches untouched"


@pytest.mark.parametrize("name", TRANSFORMS)
def test_mixed_batches_are_the_same_in_every_run(path, name):
    runs = []
    for _ in range(2):
        loader = make(path, TRANSFORMS[name]())
        runs.append([epoch_digests(loader) for _ in range(2)])  # epochs 0 and 1
        loader.close()
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1], "epoch 1 mixed exactly as epoch 0"


@pytest.mark.parametrize("name", ["timm-mixup-cutmix", "tv-random-choice"])
def test_mixed_batches_resume_exactly(path, name):
    run_test_save_load_state(lambda: make(path, TRANSFORMS[name]()), midpoint=2, later_epoch=1)


def test_the_programs_own_random_streams_are_untouched(path):
    def draws():
        return torch.rand(4), np.random.rand(4)

    torch.manual_seed(123)
    np.random.seed(123)
    want = draws()
    torch.manual_seed(123)
    np.random.seed(123)
    loader = make(path, TRANSFORMS["timm-mixup-cutmix"]())
    for _ in loader:
        pass
    loader2 = make(path, TRANSFORMS["tv-mixup"]())
    for _ in loader2:
        pass
    got = draws()
    assert torch.equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_the_transform_runs_in_the_consumer_thread_on_the_output_device(path):
    seen = []

    def spy(images, labels):
        seen.append((threading.get_ident(), images.device, labels.device, images.shape[0]))
        return images, labels

    batches = list(make(path, spy))
    assert len(seen) == len(batches) == N // BATCH
    assert {s[0] for s in seen} == {threading.get_ident()}
    assert all(s[1] == s[2] == torch.device("cpu") and s[3] == BATCH for s in seen)
