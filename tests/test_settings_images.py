"""Settings that depend on the dataset's images (fastfeed/loader/settings.py, `ImageProfile` from the sample table): the
DALI thread count grows with the share of images the hardware decoder cannot take; large photos give a tenth of their
JPEGs to DALI's CUDA decoder."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import fastfeed
from fastfeed.datasets import open_dataset
from fastfeed.types import ImageProfile
from fastfeed.world import World
from test_epoch import settings_for


def _dali(share, cpus, local=1, num_threads="auto", pixels=200_000, **kw):
    world = World(cpus=cpus, local_world_size=local)
    return settings_for(world=world, decoder="dali", num_threads=num_threads, pipelines=2,
                        images=ImageProfile(median_pixels=pixels, cpu_decode_share=share), **kw)


def _threads(share, cpus, **kw):
    return _dali(share, cpus, **kw).decode_threads


def test_dali_threads_follow_the_share_the_hardware_decoder_cannot_take():
    assert settings_for(decoder="dali", num_threads="auto").decode_threads == 2  # profile not known yet
    assert _threads(0.0, 32) == 2 and _threads(0.05, 32) == 2  # the hardware decoder does the work
    assert _threads(0.5, 16) == 4  # half of 16 cores over 2 pipelines
    assert _threads(0.7, 32) == 8  # capped
    assert _threads(0.7, 32, local=8) == 2  # 4 cores per rank: never fewer than the default
    assert _threads(0.7, 32, num_threads=3) == 3  # an explicit count wins


def test_a_detection_pipeline_on_the_gpu_gets_the_threads_its_pngs_need(monkeypatch):
    """The pipeline tuner starts one GPU pipeline; a detection-like one decodes its PNGs on its own threads until a
    second comes, so its threads are the PNG share of the rank's cores, not half of it (as a classification
    pipeline's, whose DALI threads were measured for two). The settings alone, for a GPU this machine need not have."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    kw = dict(world=World(cpus=4, local_world_size=1), decoder="dali", num_threads="auto", device="cuda",
              images=ImageProfile(median_pixels=200_000, cpu_decode_share=1.0))
    assert settings_for(task="detect", **kw).decode_threads == 4
    assert settings_for(task="semantic", **kw).decode_threads == 4
    assert settings_for(**kw).decode_threads == 2
    jpegs = dict(kw, images=ImageProfile(median_pixels=200_000, cpu_decode_share=0.0))
    assert settings_for(task="detect", **jpegs).decode_threads == 2  # the hardware decoder does the work


def test_large_photos_share_the_decode_with_dalis_cuda_decoder():
    photo = _dali(0.0, 16)  # ImageNet-like: the hardware decoder takes every JPEG, two threads feed it
    assert (photo.hw_decoder_load, photo.decode_threads) == (1.0, 2)
    big = _dali(0.0, 16, pixels=4032 * 3024)  # 12-MP phone photos
    assert (big.hw_decoder_load, big.decode_threads) == (0.9, 4)
    mid = _dali(0.0, 16, pixels=1600 * 1400)  # photos of ~2 MP (0.9 and 4 trained 10-20% faster on an H200)
    assert (mid.hw_decoder_load, mid.decode_threads) == (0.9, 4)
    assert _dali(0.0, 16, pixels=999_999).hw_decoder_load == 1.0  # the bound is LARGE_PHOTO_PIXELS
    assert _threads(0.7, 32, pixels=4032 * 3024) == 8  # PNG-heavy large photos: the share's threads, capped
    assert _threads(0.0, 16, pixels=4032 * 3024, num_threads=3) == 3  # explicit settings win
    assert _dali(0.0, 16, pixels=4032 * 3024, hw_decoder_load=1.0).hw_decoder_load == 1.0


def test_only_large_photos_are_read_by_dali_in_place_from_the_ring():
    """pinned_input (decode/dali.py): paid on 12-MP photos, slowed ResNet-18's step on ImageNet-like ones."""
    assert _dali(0.0, 16, pixels=4032 * 3024).pinned_input is True
    assert _dali(0.0, 16).pinned_input is False and _dali(0.0, 16, pixels=3_999_999).pinned_input is False
    assert _dali(0.0, 16, pixels=4_000_000).pinned_input is True  # the bound is PINNED_INPUT_PIXELS
    assert settings_for(decoder="dali").pinned_input is False  # profile not known


def test_large_photos_have_the_hardware_decoder_preallocate_for_their_size(monkeypatch):
    """`preallocate` (settings.py): the GPU decoders of a Loader on large photos size nvJPEG's buffers at the build
    for the table's 99th-percentile image; smaller photos, and decoders off the GPU, leave them to DALI."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)

    def prealloc(pixels, size, **kw):
        images = ImageProfile(median_pixels=pixels, cpu_decode_share=0.0, large_size=size)
        return settings_for(world=World(cpus=16), decoder="dali", images=images, **kw).preallocate

    assert prealloc(4032 * 3024, (4032, 3024), device="cuda") == (4032, 3024)
    assert prealloc(999_999, (1200, 900), device="cuda") is None  # ImageNet-like: no gain measured
    assert prealloc(4032 * 3024, (4032, 3024), device="cpu") is None


def test_the_preallocated_size_is_not_set_by_one_outlier(tmp_path, pack_cli):
    src = tmp_path / "src" / "c0"
    src.mkdir(parents=True)
    for i in range(100):
        Image.new("RGB", (12, 8), (i, 0, 0)).save(src / f"s{i:03d}.jpg")
    Image.new("RGB", (96, 64)).save(src / "huge.jpg")
    pack_cli(tmp_path / "src", tmp_path / "wds", "--format", "wds")
    assert open_dataset(tmp_path / "wds").image_profile().large_size == (12, 8)


def test_dalis_cpu_backend_runs_two_pipelines_sharing_the_cores():
    """Two pipelines of half the threads each, on the CPU as for a GPU: one batch is normalised (after DALI's run,
    outside its threads) while the next is decoded (2 cores: 1.11-1.22x one pipeline of two threads)."""
    s = settings_for(world=World(cpus=8), decoder="cpu-dali", num_threads="auto")
    assert (s.pipelines, s.decode_threads) == (2, 4)
    one = settings_for(world=World(cpus=2), decoder="cpu-dali", num_threads="auto")
    assert (one.pipelines, one.decode_threads) == (2, 1)
    assert settings_for(decoder="cpu-pil", num_threads="auto").pipelines == 1  # pillow-simd: one pool per batch
    assert settings_for(decoder="cpu-dali", pipelines=1).pipelines == 1  # given: kept


def test_the_cpu_detection_decoder_runs_two_pipelines_sharing_the_cores():
    """Its batch runs in steps that wait for their slowest thread (decode, then draw): a second pipeline fills the
    waits (2 cores: 1.1x one pipeline of two threads, benchmarks/README.md)."""
    from fastfeed.detect.geometry import DetectAugment

    for task in ("detect", "semantic"):
        s = settings_for(world=World(cpus=8), task=task, augment=DetectAugment(), num_threads="auto")
        assert (s.decoder, s.pipelines, s.decode_threads) == ("cpu", 2, 4)
    assert settings_for(task="detect", augment=DetectAugment(), pipelines=1).pipelines == 1  # given: kept


def test_the_profile_comes_from_the_packed_table(tmp_path, pack_cli):
    src = tmp_path / "src" / "c0"
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    sizes = {"a.jpg": (40, 30), "b.jpg": (64, 48), "c.jpg": (100, 80), "d.png": (50, 50), "e.png": (90, 70)}
    for name, (w, h) in sizes.items():
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(src / name)
    pack_cli(tmp_path / "src", tmp_path / "wds", "--format", "wds")
    profile = open_dataset(tmp_path / "wds").image_profile()
    assert profile.median_pixels == float(np.median([w * h for w, h in sizes.values()]))
    assert profile.cpu_decode_share == pytest.approx(2 / 5)  # the PNGs
    assert profile.large_size == (100, 80)  # the 99th percentile of five: the largest
    # thumbnails (median <= CPU_DECODE_MAX_PIXELS) cropped small: DALI's CPU backend, on the CPU path too
    with fastfeed.Loader(tmp_path / "wds", batch_size=2, device="cpu", image_size=64) as L:
        assert L.settings.decoder == "cpu-dali"
        assert L.settings.pipelines == 2  # one batch normalised while the next is decoded (settings.py)
        images, _ = next(iter(L))
        assert images.shape == (2, 3, 64, 64) and images.device.type == "cpu"
    with fastfeed.Loader(tmp_path / "wds", batch_size=2, device="cpu") as L:
        assert L.settings.decoder == "cpu-pil"  # 224 px: pillow-simd's cost hardly grows with the output, DALI's does
        info = L.stats()["info"]
        assert info["images"] == {"median_pixels": profile.median_pixels, "cpu_decode_share": 0.4,
                                  "large_size": [100, 80]}
        assert info["ring_slots"] == L.stats()["ring"]["slots"]


def test_auto_takes_the_cpu_decoder_for_a_dataset_mostly_of_images_only_pil_reads(tmp_path):
    """Thumbnails cropped small take DALI's CPU backend; the same thumbnails as 16-bit TIFFs (pack's `pil_only`),
    which DALI's decoder would hand to PIL one by one, take the PIL decoder itself."""
    from fastfeed.decode import PIL_ONLY_MAX_SHARE, resolve_kind

    thumbs = ImageProfile(median_pixels=64 * 64, cpu_decode_share=1.0)
    assert resolve_kind("auto", "cpu", thumbs, image_size=64) == "cpu-dali"
    odd = ImageProfile(median_pixels=64 * 64, cpu_decode_share=1.0, pil_only_share=PIL_ONLY_MAX_SHARE + 0.01)
    assert resolve_kind("auto", "cpu", odd, image_size=64) == "cpu-pil"
    for i in range(6):
        (tmp_path / "src" / "a").mkdir(parents=True, exist_ok=True)
        grey = (np.arange(64 * 48, dtype=np.uint16).reshape(48, 64) * (7 + i)).astype(np.uint16)
        Image.fromarray(grey).save(tmp_path / "src" / "a" / f"{i}.tif")
    from fastfeed.cli import main

    assert main(["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--quiet"]) == 0
    with open_dataset(tmp_path / "out") as ds:
        assert ds.image_profile().pil_only_share == 1.0
    with fastfeed.Loader(tmp_path / "out", batch_size=2, image_size=32, device="cpu") as loader:
        assert loader.settings.decoder == "cpu-pil"
        assert next(iter(loader))[0].shape == (2, 3, 32, 32)
