"""The GPU renderer (fastfeed/detect/gpu_render.py) against the CPU renderer (render.py), to the bit, on the CPU:
Triton runs the same kernels in its interpreter (TRITON_INTERPRET=1, set before the kernels are defined, hence a
process of its own). Sources of random pixels, larger and smaller than the output (down- and upscaling, up to 3x),
mosaic and letterbox geometries, flipped either way and not; the oracle is the CPU renderer with exact=True, itself Pillow's
arithmetic (tests/test_detect_geometry.py checks it against Pillow); its default (pillow-simd inside each tile) is
within a level of it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from fastfeed.detect.geometry import plan_batch, DetectAugment
    from fastfeed.detect.render import render
    from fastfeed.detect.gpu_render import render_batch

    dev = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    rng = np.random.default_rng(0)
    B, S = 4, 24
    sizes = np.array([(11, 17), (70, 36), (20, 72), (9, 40)])
    imgs = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for w, h in sizes]
    flat = torch.from_numpy(np.concatenate([i.ravel() for i in imgs]))
    per = np.array([i.size for i in imgs])
    off = np.cumsum(per) - per
    report = []
    for train, epoch, aug in [(True, 0, DetectAugment(scale=0.9, flipud=0.5)),
                              (True, 1, DetectAugment(mosaic=0.0, fliplr=1.0)),
                              (False, 0, DetectAugment())]:
        g = plan_batch(np.arange(B) + 7 * epoch, sizes, S, epoch=epoch, seed=2, aug=aug, train=train)
        ref = np.stack([render(imgs, g, k, hsv=False, exact=True) for k in range(B)])
        fast = np.stack([render(imgs, g, k, hsv=False) for k in range(B)])
        got = render_batch(flat.to(dev), off, sizes, g).cpu().numpy()
        report.append({"train": train, "tiles": int(g.n_tiles.sum()), "flipped": int(g.flip.sum()),
                       "flipped_ud": int(g.flipud.sum()), "differ": int((ref != got).sum()), "shape": list(got.shape),
                       "simd_levels": int(np.abs(fast.astype(int) - ref).max())})
    # a source decoded at another size than the stored one (a header that disagreed): the geometry is scaled to it
    g = plan_batch(np.arange(2), np.array([(60, 30), (60, 30)]), S, epoch=0, seed=0, train=False)
    small = [rng.integers(0, 256, (15, 30, 3), dtype=np.uint8) for _ in range(2)]
    ref = np.stack([render(small, g, k, hsv=False, exact=True) for k in range(2)])
    fast = np.stack([render(small, g, k, hsv=False) for k in range(2)])
    got = render_batch(torch.from_numpy(np.concatenate([s.ravel() for s in small])).to(dev), np.array([0, 1350]),
                       np.array([(30, 15), (30, 15)]), g).cpu().numpy()
    report.append({"train": False, "tiles": 2, "flipped": 0, "differ": int((ref != got).sum()),
                   "shape": list(got.shape), "simd_levels": int(np.abs(fast.astype(int) - ref).max())})
    # rows longer than a kernel's block (256 values), tiles shrunk up to 3x beside magnified ones in one batch
    S2 = 120
    sizes2 = np.array([(330, 200), (40, 25), (250, 360), (90, 150)])
    imgs2 = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for w, h in sizes2]
    per2 = np.array([i.size for i in imgs2])
    g = plan_batch(np.arange(4), sizes2, S2, epoch=3, seed=5, aug=DetectAugment(scale=0.9), train=True)
    ref = np.stack([render(imgs2, g, k, hsv=False, exact=True) for k in range(4)])
    got = render_batch(torch.from_numpy(np.concatenate([i.ravel() for i in imgs2])).to(dev), np.cumsum(per2) - per2,
                       sizes2, g).cpu().numpy()
    report.append({"train": True, "tiles": int(g.n_tiles.sum()), "flipped": int(g.flip.sum()),
                   "differ": int((ref != got).sum()), "shape": list(got.shape), "simd_levels": 0,
                   "widest": int((g.dst_rect[..., 2] - g.dst_rect[..., 0]).max())})
    print(json.dumps(report))
""")


def _render_check(device: str, env: dict) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, device], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(report) == 5
    assert report[0]["tiles"] == 16 and report[0]["flipped"] > 0 and report[0]["flipped_ud"] > 0  # mosaic, some flipped
    assert report[1]["tiles"] == 4 and report[1]["flipped"] == 4
    assert report[4]["widest"] * 3 > 256  # a row of several blocks
    for case in report:
        assert case["differ"] == 0 and case["simd_levels"] <= 1, case
    assert [case["shape"][1:] for case in report] == [[24, 24, 3]] * 4 + [[120, 120, 3]]


def test_gpu_renderer_draws_the_cpu_renderers_pixels_to_the_bit():
    _render_check("cpu", dict(os.environ, TRITON_INTERPRET="1"))


@pytest.mark.gpu
def test_compiled_the_gpu_renderer_still_draws_them_to_the_bit():
    """The same on a GPU, compiled (Triton's compiler refuses some code its interpreter runs, and may round
    differently): still to the bit."""
    _render_check("cuda", dict(os.environ))


def test_the_gpu_renderer_refuses_rotated_tiles():
    import numpy as np

    from fastfeed.detect.geometry import DetectAugment, plan_batch
    from fastfeed.detect.gpu_render import plan_tiles

    g = plan_batch(np.arange(2), np.array([(50, 40), (30, 60)]), 32, epoch=0, seed=0, aug=DetectAugment(degrees=5))
    with pytest.raises(ValueError, match="axis-aligned"):
        plan_tiles(g, np.array([0, 6000]), np.array([(50, 40), (30, 60)]))


HSV_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np, torch
    from fastfeed.detect.hsv import apply_hsv_inplace, apply_hsv_nhwc, apply_hsv_torch, finish_nhwc

    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (4, 48, 40, 3), dtype=np.uint8)
    x[0, 0, :6] = [[255, 0, 0], [0, 255, 0], [0, 0, 255], [0, 0, 0], [255, 255, 255], [128, 128, 128]]
    gains = np.array([[1.01, 0.5, 1.3], [0.99, 1.6, 0.7], [1.0, 1.0, 1.0], [1.015, 1.7, 1.4]])
    cpu = x.copy()
    for k in range(4):
        apply_hsv_inplace(cpu[k], gains[k])
    got = torch.from_numpy(x.copy()).to(sys.argv[1])
    apply_hsv_nhwc(got, torch.from_numpy(gains))
    got = got.cpu()
    ops = apply_hsv_torch(torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(gains)).permute(0, 2, 3, 1)
    diff = np.abs(got.numpy().astype(int) - cpu)
    # finish_nhwc: the same levels (the oracle: this kernel's own in-place ones, so rounding ties cannot differ),
    # normalised as torch does it, in each output dtype and layout; and without gains, x itself normalised
    mean = torch.tensor([0.485, 0.456, 0.406]) * 255
    std = torch.tensor([0.229, 0.224, 0.225]) * 255
    finish_differ = 0
    for dtype in (torch.float16, torch.float32, torch.uint8):
        for fmt in (torch.contiguous_format, torch.channels_last):
            for g, levels in ((gains, got), (None, torch.from_numpy(x))):
                out = torch.empty((4, 3, 48, 40), dtype=dtype, device=sys.argv[1], memory_format=fmt)
                norm = dtype != torch.uint8
                finish_nhwc(torch.from_numpy(x).to(sys.argv[1]), g, out=out, mean=mean if norm else None,
                            std=std if norm else None)
                want = levels.permute(0, 3, 1, 2)
                if norm:
                    want = ((want.float() - mean.view(1, 3, 1, 1)) / std.view(1, 3, 1, 1)).to(dtype)
                finish_differ += int((out.cpu() != want).sum()) + int(out.is_contiguous(memory_format=fmt) is False)
    print(json.dumps({"max": int(diff.max()), "share": float((diff > 0).mean()),
                      "ops_differ": int((ops.numpy() != got.numpy()).sum()),
                      "gain_one_unchanged": bool(np.array_equal(got[2].numpy(), x[2])),
                      "finish_differ": finish_differ}))
""")


def _hsv_check(device: str, env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", HSV_SCRIPT, device], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _hsv_ok(got: dict, ops_differ: int) -> bool:
    return (got["max"] <= 1 and got["share"] < 0.02 and got["ops_differ"] <= ops_differ
            and got["gain_one_unchanged"] and got["finish_differ"] == 0)


def test_the_one_pass_gpu_hsv_is_torchs_and_the_cpus_to_a_level():
    """apply_hsv_nhwc (the GPU decoder's Triton pass) under Triton's interpreter: torch's float32 form exactly, the
    CPU's one to a level, and a gain of 1 changes nothing; finish_nhwc (the same pass normalising into the Loader's
    dtype and layout) gives those levels normalised as torch normalises them, to the bit."""
    got = _hsv_check("cpu", dict(os.environ, TRITON_INTERPRET="1"))
    assert _hsv_ok(got, ops_differ=0), got


@pytest.mark.gpu
def test_the_one_pass_hsv_compiles_and_agrees_on_the_gpu():
    """The same on a GPU, compiled (Triton's compiler refuses some code its interpreter runs). Compiled, its float32
    division is the GPU's approximate one, so a level at a rounding tie may differ from torch's (22 of 23,040
    values on the H100): at most 0.5% of them here."""
    got = _hsv_check("cuda", dict(os.environ))
    assert _hsv_ok(got, ops_differ=115), got


def test_bfloat16_batches_take_the_one_pass_only_where_the_gpu_stores_that_type(monkeypatch):
    import torch

    from fastfeed.detect import decoder

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(decoder, "_HAVE_TRITON", True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))  # a V100
    assert decoder._one_pass(gpu, torch.float16) and not decoder._one_pass(gpu, torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100
    assert decoder._one_pass(gpu, torch.bfloat16)
    monkeypatch.setattr(decoder, "_HAVE_TRITON", False)  # torch's operations, whatever the GPU
    assert not decoder._one_pass(gpu, torch.float16)
