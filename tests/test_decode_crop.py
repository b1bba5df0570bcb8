"""Crop windows: torchvision's RandomResizedCrop distribution, bounds, determinism; eval window exactness."""
import numpy as np
import pytest
import torch
from scipy import stats
from torchvision.transforms import RandomResizedCrop

from fastfeed.decode import Windows, crop_windows
from fastfeed.decode.crop import eval_resize_size


def _tv_params(W, H, n, seed=0):
    torch.manual_seed(seed)
    img = torch.empty(1, H, W)
    out = np.array([RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(n)])
    return out  # i, j, h, w


@pytest.mark.parametrize("W,H", [(500, 375), (375, 500), (1000, 120)])
def test_train_windows_follow_torchvision_distribution(W, H):
    n = 3000
    w = crop_windows(np.full(n, W), np.full(n, H), np.arange(n), seed=1, epoch=0, train=True, image_size=224)
    tv = _tv_params(W, H, n)
    ours_area = w.w.astype(float) * w.h / (W * H)
    tv_area = tv[:, 3].astype(float) * tv[:, 2] / (W * H)
    assert stats.ks_2samp(ours_area, tv_area).pvalue > 1e-3
    assert stats.ks_2samp(np.log(w.w / w.h), np.log(tv[:, 3] / tv[:, 2])).pvalue > 1e-3
    # Corner position relative to the free range: uniform in both.
    free = np.maximum(W - w.w, 1)
    assert stats.ks_2samp(w.x / free, tv[:, 1] / np.maximum(W - tv[:, 3], 1)).pvalue > 1e-3
    # The fallback (central crop) is hit as often as in torchvision (the 1000x120 image needs it a lot).
    ours_fb = np.mean((w.x == (W - w.w) // 2) & (w.y == (H - w.h) // 2))
    tv_fb = np.mean((tv[:, 1] == (W - tv[:, 3]) // 2) & (tv[:, 0] == (H - tv[:, 2]) // 2))
    assert abs(ours_fb - tv_fb) < 0.05
    assert 0.4 < w.flip.mean() < 0.6


@pytest.mark.parametrize("seed", [0, 7])
def test_train_windows_inside_image(seed):
    rng = np.random.default_rng(seed)
    n = 5000
    W = rng.integers(1, 3000, n)
    H = rng.integers(1, 3000, n)
    w = crop_windows(W, H, np.arange(n), seed=seed, epoch=3, train=True, image_size=224)
    assert (w.x >= 0).all() and (w.y >= 0).all() and (w.w >= 1).all() and (w.h >= 1).all()
    assert (w.x + w.w <= W).all() and (w.y + w.h <= H).all()
    assert w.x.dtype == np.int32 and w.flip.dtype == bool


def test_windows_are_a_pure_function_of_seed_epoch_id():
    W, H = np.array([640, 480, 300, 1000]), np.array([480, 640, 300, 200])
    ids = np.array([5, 17, 123456789, 42])
    a = crop_windows(W, H, ids, seed=3, epoch=2, train=True, image_size=224)
    # Same ids in another order / another batch split give the same per-sample windows.
    perm = np.array([2, 0, 3, 1])
    b = crop_windows(W[perm], H[perm], ids[perm], seed=3, epoch=2, train=True, image_size=224)
    c = crop_windows(W[:1], H[:1], ids[:1], seed=3, epoch=2, train=True, image_size=224)
    for f in ("x", "y", "w", "h", "flip"):
        np.testing.assert_array_equal(getattr(a, f)[perm], getattr(b, f))
        assert getattr(a, f)[0] == getattr(c, f)[0]
    n = 256
    base = crop_windows(np.full(n, 640), np.full(n, 480), np.arange(n), seed=3, epoch=2, train=True, image_size=224)
    other_epoch = crop_windows(np.full(n, 640), np.full(n, 480), np.arange(n), seed=3, epoch=3, train=True,
                               image_size=224)
    other_seed = crop_windows(np.full(n, 640), np.full(n, 480), np.arange(n), seed=4, epoch=2, train=True,
                              image_size=224)
    assert (base.x != other_epoch.x).mean() > 0.9
    assert (base.x != other_seed.x).mean() > 0.9


@pytest.mark.parametrize("W,H,S", [(500, 375, 224), (451, 300, 224), (1234, 777, 160), (300, 300, 224),
                                   (4000, 100, 224)])
def test_eval_box_is_torchvision_resize_centercrop(W, H, S):
    w = crop_windows([W], [H], [0], seed=0, epoch=0, train=False, image_size=S)
    R = eval_resize_size(S)
    short, long_ = min(W, H), max(W, H)
    new = (R, int(R * long_ / short)) if W <= H else (int(R * long_ / short), R)
    ox, oy = int(round((new[0] - S) / 2.0)), int(round((new[1] - S) / 2.0))
    expect = [ox * W / new[0], oy * H / new[1], (ox + S) * W / new[0], (oy + S) * H / new[1]]
    np.testing.assert_allclose(w.box[0], expect, rtol=1e-12)
    # The whole-pixel ROI encloses the exact box and stays inside the image.
    assert w.x[0] <= w.box[0, 0] and w.x[0] + w.w[0] >= w.box[0, 2] - 1e-6 and w.x[0] + w.w[0] <= W
    assert w.y[0] <= w.box[0, 1] and w.y[0] + w.h[0] >= w.box[0, 3] - 1e-6 and w.y[0] + w.h[0] <= H
    assert not w.flip.any()


def test_clamped_keeps_windows_inside_smaller_images():
    w = Windows(np.array([10, 0], np.int32), np.array([5, 0], np.int32), np.array([100, 50], np.int32),
                np.array([100, 50], np.int32), np.array([False, True]))
    c = w.clamped([60, 20], [40, 20])
    assert (c.x + c.w <= [60, 20]).all() and (c.y + c.h <= [40, 20]).all() and (c.w >= 1).all()
    assert (c.box[:, 2] <= [60, 20]).all() and (c.box[:, 3] <= [40, 20]).all()


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        crop_windows([10, 10], [10], [0, 1], seed=0, epoch=0, train=True, image_size=224)
    with pytest.raises(ValueError):
        crop_windows([0], [10], [0], seed=0, epoch=0, train=True, image_size=224)
    with pytest.raises(ValueError):
        crop_windows([10], [10], [-1], seed=0, epoch=0, train=True, image_size=224)
