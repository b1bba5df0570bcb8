"""`Loader(task="semantic")` end to end on the CPU: WebDataset shards of images and their class-id masks (`KEY.png` +
`KEY.seg.png`, as segmentation sets are shared), adopted by `fastfeed index`, read back as batches of images and
masks. The oracle does not trust the implementation: every object is a solid rectangle of its class's colour on a
grey background (class 0), so after any augmentation the mask must say, away from edges, exactly what the pixels
show: an object's class under its colour, 0 under the background's grey, the ignore index under the padding.
"""
from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image
from test_detect_loader import _UNDO, CLASS_HUES, colour_classes

import fastfeed
from fastfeed.detect import DetectAugment
from fastfeed.pack.index import index_shards

S = 128
PAD = 114  # DetectAugment.pad_value
IGNORE = 255
NO_HSV = dict(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)


def _png(array: np.ndarray, mode: str | None = None, palette: bool = False) -> bytes:
    img = Image.fromarray(array) if mode is None else Image.fromarray(array, mode)
    if palette:
        img = img.convert("P")  # the ids as palette indices, as VOC's SegmentationClass stores them
        img.putpalette([v for i in range(256) for v in ((i * 40) % 256, (i * 90) % 256, (i * 10) % 256)])
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def make_scene(rng, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """(image uint8 [h, w, 3], mask uint8 [h, w]): a grey background (class 0, never the padding's grey) and 1-3
    non-overlapping solid rectangles of classes 1-4, each in its class's hue."""
    from colorsys import hsv_to_rgb

    grey = int(rng.choice(np.r_[30:100, 130:200]))
    img = np.full((h, w, 3), grey, np.uint8)
    mask = np.zeros((h, w), np.uint8)
    placed = []
    for _ in range(int(rng.integers(1, 4))):
        bw, bh = int(rng.integers(10, max(11, w // 2))), int(rng.integers(10, max(11, h // 2)))
        x0, y0 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
        if any(x0 < b[2] + 3 and b[0] < x0 + bw + 3 and y0 < b[3] + 3 and b[1] < y0 + bh + 3 for b in placed):
            continue
        c = int(rng.integers(1, len(CLASS_HUES) + 1))
        img[y0:y0 + bh, x0:x0 + bw] = np.round(np.array(hsv_to_rgb(CLASS_HUES[c - 1], 1.0, 0.9)) * 255)
        mask[y0:y0 + bh, x0:x0 + bw] = c
        placed.append((x0, y0, x0 + bw, y0 + bh))
    return img, mask


def write_shards(folder, samples: list[tuple[str, dict]], per_shard: int = 10) -> None:
    """WebDataset shards of `samples` [(key, {ext: bytes})], members in the order given."""
    folder.mkdir(parents=True)
    for s in range(0, len(samples), per_shard):
        with tarfile.open(folder / f"shard-{s // per_shard:04d}.tar", "w") as tar:
            for key, members in samples[s:s + per_shard]:
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def seg_set(tmp_path_factory):
    """24 scenes of 60-260 px as indexed shards; masks as L, some as P (palette indices)."""
    rng = np.random.default_rng(0)
    root = tmp_path_factory.mktemp("seg")
    samples, truth = [], []
    for i in range(24):
        img, mask = make_scene(rng, int(rng.integers(60, 260)), int(rng.integers(60, 260)))
        samples.append((f"s{i:03d}", {"png": _png(img), "seg.png": _png(mask, palette=i % 3 == 0)}))
        truth.append((img, mask))
    write_shards(root / "shards", samples)
    index_shards(str(root / "shards"))
    return root / "shards", truth


def interior(a: np.ndarray) -> np.ndarray:
    """bool [B, H, W]: the pixels whose 3x3 neighbourhood holds one value (edges of the output excluded)."""
    out = np.zeros(a.shape, bool)
    c = a[:, 1:-1, 1:-1]
    same = np.ones(c.shape, bool)
    for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
            same &= a[:, 1 + dy:a.shape[1] - 1 + dy, 1 + dx:a.shape[2] - 1 + dx] == c
    out[:, 1:-1, 1:-1] = same
    return out


def check_masks_against_pixels(batch: dict, exact_padding: bool = True) -> int:
    """The oracle, both ways, away from edges: a mask's class c (1-4) lies under c's colour, its 0 under no pure
    colour and not the padding's grey, its ignore index under the padding's grey; and each colour, the background's
    grey and the padding's grey (exact_padding: pixels untouched by HSV) have the mask's class, 0, ignore. Returns
    the number of labelled pixels checked."""
    images, masks = batch["images"], batch["masks"].numpy()
    assert masks.dtype == np.int64 and masks.shape == (len(images), *images.shape[2:])
    colour = colour_classes(images) + 1  # 1-4 for the classes, 0 for grey and blends
    rgb = images.permute(0, 2, 3, 1).numpy().astype(np.int16)
    # Downscaled, an object's edge pixels blend its colour with the grey around it: "pure" colour (over 85% of
    # the pixel: its centre is inside) for the way from colour to mask.
    sat = (rgb.max(-1) - rgb.min(-1)) / np.maximum(rgb.max(-1), 1)
    pure = np.where(sat > 0.85, colour, 0)
    grey = (rgb.max(-1) - rgb.min(-1)) <= 2
    pad = (rgb == PAD).all(-1)
    steady_mask, steady_colour = interior(masks), interior(pure)
    for c in range(1, len(CLASS_HUES) + 1):
        assert (colour[steady_mask & (masks == c)] == c).all(), f"mask class {c} where its colour is not"
        assert (masks[steady_colour & (pure == c)] == c).all(), f"colour of class {c} where the mask says other"
    bg = steady_mask & (masks == 0)
    assert (pure[bg] == 0).all() and not (exact_padding and pad[bg].any()), "mask 0 (background) off the background"
    ign = steady_mask & (masks == IGNORE)
    assert grey[ign].all(), "ignore index over an object"
    if exact_padding:
        assert pad[ign].all(), "ignore index off the padding"
        assert (masks[interior(pad.astype(np.int8)) & pad] == IGNORE).all(), "padding labelled as a class"
    return int((steady_mask & (masks != IGNORE)).sum())


@pytest.mark.parametrize("augment", [DetectAugment(mosaic=0.0, **NO_HSV), DetectAugment(mosaic=1.0, **NO_HSV),
                                     DetectAugment(mosaic=0.5, degrees=15.0, shear=5.0, **NO_HSV),
                                     DetectAugment(mosaic=0.0), DetectAugment(mosaic=0.5, flipud=0.5, **NO_HSV)],
                         ids=["scale-translate-flip", "mosaic", "rotate-shear", "hsv", "flipud"])
def test_training_masks_follow_the_pixels(seg_set, augment):
    shards, _ = seg_set
    loader = fastfeed.Loader(shards, task="semantic", batch_size=8, image_size=S, dtype=torch.uint8, device="cpu",
                             augment=augment, seed=1)
    assert loader.settings.mask == "seg.png"  # the samples' one PNG member besides the image
    exact = augment.hsv_v == 0
    checked = 0
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            assert set(batch) >= {"images", "masks", "ids", "orig_size", "scale", "pad", "valid"}
            assert "boxes" not in batch
            checked += check_masks_against_pixels(batch, exact_padding=exact)
    assert checked > 50_000
    loader.close()


def test_evaluation_masks_are_the_letterboxed_masks(seg_set):
    """train=False: each mask resized like its image (long side to S), each output pixel taking the
    source pixel under its centre (in integers: floor((2x + 1) w0 / 2w)), centred in ignore padding at the image's
    `pad`; every sample once."""
    shards, truth = seg_set
    loader = fastfeed.Loader(shards, task="semantic", batch_size=5, image_size=S, train=False, device="cpu",
                             dtype=torch.uint8)
    seen = 0
    for batch in loader:
        check_masks_against_pixels(batch)
        for k, i in enumerate(batch["ids"].tolist()):
            mask = truth[i][1]
            h0, w0 = mask.shape
            r = S / max(w0, h0)  # ultralytics' load_image, then LetterBox(scaleup=False) keeps that size
            w, h = min(int(np.ceil(w0 * r)), S), min(int(np.ceil(h0 * r)), S)
            left, top = (int(v) for v in batch["pad"][k].tolist())
            want = np.full((S, S), IGNORE, np.int64)
            rows, cols = (2 * np.arange(h) + 1) * h0 // (2 * h), (2 * np.arange(w) + 1) * w0 // (2 * w)
            want[top:top + h, left:left + w] = mask[rows[:, None], cols[None, :]]
            assert np.array_equal(batch["masks"][k].numpy(), want), i
            seen += 1
    assert seen == len(truth)
    loader.close()


def test_sixteen_bit_masks_and_a_given_mask_member(tmp_path):
    """More than 256 classes: I;16 masks give their ids whole; mask= names the member (two PNG members here)."""
    rng = np.random.default_rng(2)
    samples = []
    for i in range(6):
        img, mask = make_scene(rng, 90, 70)
        ids = mask.astype(np.uint16) * 1000  # 0, 1000, ..., 4000
        samples.append((f"k{i}", {"png": _png(img), "label.png": _png(ids, "I;16"), "depth.png": _png(mask)}))
    write_shards(tmp_path / "sh", samples)
    index_shards(str(tmp_path / "sh"))
    with pytest.raises(ValueError, match="mask="):
        fastfeed.Loader(tmp_path / "sh", task="semantic", batch_size=3, device="cpu")
    loader = fastfeed.Loader(tmp_path / "sh", task="semantic", mask="label.png", batch_size=3, image_size=64,
                             train=False, device="cpu", ignore_index=65535)
    values = set()
    for batch in loader:
        values |= set(np.unique(batch["masks"].numpy()).tolist())
    assert values <= {0, 1000, 2000, 3000, 4000, 65535} and {0, 65535} < values and len(values) >= 3
    loader.close()


def test_one_bit_masks_are_binary_class_ids(tmp_path):
    """A binary mask stored as a 1-bit PNG (mode "1", as many medical and matting sets store them): ids 0 and 1,
    packed byte for byte and loaded under the pixels (every object here has class 1's colour)."""
    from colorsys import hsv_to_rgb

    from conftest import run_pack

    rng = np.random.default_rng(6)
    colour = np.round(np.array(hsv_to_rgb(CLASS_HUES[0], 1.0, 0.9)) * 255)
    for d in ("img", "masks"):
        (tmp_path / d).mkdir()
    for i in range(6):
        _, mask = make_scene(rng, 90, 70)
        img = np.full((70, 90, 3), 60, np.uint8)
        img[mask > 0] = colour
        Image.fromarray(img).save(tmp_path / "img" / f"{i}.png")
        Image.fromarray(mask > 0).save(tmp_path / "masks" / f"{i}.png")
        with Image.open(tmp_path / "masks" / f"{i}.png") as stored:
            assert stored.mode == "1"
    run_pack(tmp_path / "img", tmp_path / "out", "--masks", str(tmp_path / "masks"))
    loader = fastfeed.Loader(tmp_path / "out", batch_size=3, image_size=64, train=False, device="cpu",
                             dtype=torch.uint8)
    assert len(loader.dataset) == 6
    values = set()
    for batch in loader:
        check_masks_against_pixels(batch)
        values |= set(np.unique(batch["masks"].numpy()).tolist())
    assert {0, 1} <= values <= {0, 1, IGNORE}
    loader.close()


@pytest.mark.parametrize("bits", [8, 16])
def test_a_bad_mask_is_a_replaced_sample_named_with_its_reason(tmp_path, bits):
    """A mask of another size, an RGB mask, a sample without its mask: each is a bad record, replaced in its batch
    (skip) and counted with its reason, or the error naming the sample (raise); beside 16-bit masks too (a batch
    of them travels as uint16, which torch cannot fill by a boolean mask)."""
    rng = np.random.default_rng(3)
    samples = []
    for i in range(8):
        img, mask = make_scene(rng, 80, 60)
        members = {"png": _png(img), "seg.png": _png(mask.astype(np.uint16) if bits == 16 and i > 3 else mask)}
        if i == 1:
            members["seg.png"] = _png(mask[:-5])
        elif i == 2:
            members["seg.png"] = _png(np.repeat(mask[..., None], 3, axis=2))
        elif i == 3:
            del members["seg.png"]
        samples.append((f"b{i}", members))
    write_shards(tmp_path / "sh", samples)
    index_shards(str(tmp_path / "sh"))
    loader = fastfeed.Loader(tmp_path / "sh", task="semantic", batch_size=8, image_size=64, train=False,
                             device="cpu", dtype=torch.uint8)
    (batch,) = list(loader)
    assert batch["valid"].tolist() == [True, False, False, False, True, True, True, True]
    assert (batch["masks"][1:4] == IGNORE).all()  # in evaluation a replaced position scores nothing
    valid = batch["valid"]
    check_masks_against_pixels({"images": batch["images"][valid], "masks": batch["masks"][valid]})
    skipped = loader.stats()["skipped"]
    assert skipped["total"] == 3 and set(skipped["by_reason"]) == {"bad_field", "missing_field"}
    loader.close()
    strict = fastfeed.Loader(tmp_path / "sh", task="semantic", batch_size=8, image_size=64, train=False,
                             device="cpu", on_error="raise")
    with pytest.raises(fastfeed.LoaderError, match="b3.*no .seg.png member"):
        list(strict)
    strict.close()


def test_masks_of_exif_rotated_photos_are_in_the_displayed_frame(tmp_path):
    """An image folder of JPEGs stored turned with the EXIF tag (2-8) that displays each scene, and its masks drawn
    on the displayed scene (as labelling tools draw them): packed with --masks in the default frame, each image
    loads as displayed under its mask, and the oracle holds; packed with --orientation ignore, the masks whose sides
    the tag swaps are rejected with that hint. The same samples in shards adopted by `fastfeed index`: as displayed
    with its orientation="exif", else as stored (the swapped-size masks then skipped and reported)."""
    from conftest import run_pack
    from fastfeed.image.contract import TRANSPOSE

    rng = np.random.default_rng(3)
    swapped = 0
    for i in range(16):
        w, h = int(rng.integers(60, 200)), int(rng.integers(60, 200))
        img, mask = make_scene(rng, w, h)
        tag, exif = 1 + i % 8, Image.Exif()
        stored = Image.fromarray(img)
        if tag > 1:
            op = TRANSPOSE[tag]
            stored, exif[0x0112] = stored.transpose(_UNDO.get(op, op)), tag
        swapped += tag >= 5 and w != h
        (tmp_path / "img").mkdir(exist_ok=True)
        (tmp_path / "masks").mkdir(exist_ok=True)
        stored.save(tmp_path / "img" / f"{i:02d}.jpg", quality=95, subsampling=0, exif=exif)
        (tmp_path / "masks" / f"{i:02d}.png").write_bytes(_png(mask))
    run_pack(tmp_path / "img", tmp_path / "out", "--masks", str(tmp_path / "masks"))
    for train in (False, True):
        loader = fastfeed.Loader(tmp_path / "out", batch_size=4, image_size=S, dtype=torch.uint8, device="cpu",
                                 train=train, augment=DetectAugment(mosaic=0.0, **NO_HSV) if train else None)
        assert loader.settings.task == "semantic" and loader.settings.orientation == "exif"
        assert len(loader.dataset) == 16 and set(loader.dataset.orientations.tolist()) == set(range(1, 9))
        assert sum(check_masks_against_pixels(b) for b in loader) > 10_000
        loader.close()

    run_pack(tmp_path / "img", tmp_path / "stored", "--masks", str(tmp_path / "masks"), "--orientation", "ignore")
    rejected = [json.loads(line) for line in (tmp_path / "stored" / "rejected.jsonl").read_text().splitlines()]
    assert swapped and len(rejected) == swapped
    assert all("pack with --orientation exif" in r["reason"] for r in rejected)

    # The same samples as someone else's shards, adopted in place: in the stored frame unless index is told
    write_shards(tmp_path / "shards", [(p.stem, {"jpg": p.read_bytes(), "seg.png": (tmp_path / "masks" /
                                                                                   f"{p.stem}.png").read_bytes()})
                                       for p in sorted((tmp_path / "img").glob("*.jpg"))], per_shard=8)
    index_shards(str(tmp_path / "shards"), orientation="exif")
    with fastfeed.Loader(tmp_path / "shards", task="semantic", batch_size=4, train=False, image_size=S,
                         dtype=torch.uint8, device="cpu") as loader:
        assert loader.settings.orientation == "exif"
        assert sum(check_masks_against_pixels(b) for b in loader) > 10_000
        assert loader.stats()["skipped"]["total"] == 0
    index_shards(str(tmp_path / "shards"), overwrite=True)
    with fastfeed.Loader(tmp_path / "shards", task="semantic", batch_size=4, train=False, image_size=S,
                         dtype=torch.uint8, device="cpu") as loader:
        assert loader.settings.orientation == "ignore"
        list(loader)
        assert loader.stats()["skipped"]["total"] == swapped  # masks of the displayed size, images as stored


def test_masks_of_images_whose_exif_readers_disagree_are_in_the_frame_the_loader_shows(tmp_path):
    """Images whose EXIF tag fastfeed's header reader and PIL read differently (kept for PIL's decode with PIL's
    tag), their masks drawn on the scene PIL displays: packed with --masks, none is rejected and the oracle holds
    in evaluation and training."""
    from conftest import run_pack
    from test_detect_loader import make_odd_exif_scenes

    truth = make_odd_exif_scenes(tmp_path / "img")
    (tmp_path / "masks").mkdir()
    for file, t in truth.items():
        (tmp_path / "masks" / f"{file.rsplit('.', 1)[0]}.png").write_bytes(_png(t["mask"]))
    run_pack(tmp_path / "img", tmp_path / "out", "--masks", str(tmp_path / "masks"))
    assert json.loads((tmp_path / "out" / "fastfeed.json").read_text())["rejected"] == 0
    for train in (False, True):
        with fastfeed.Loader(tmp_path / "out", batch_size=4, image_size=S, dtype=torch.uint8, device="cpu",
                             train=train, augment=DetectAugment(mosaic=0.5, **NO_HSV) if train else None) as loader:
            assert len(loader.dataset) == len(truth) and loader.dataset.pil_only.all()
            assert sum(check_masks_against_pixels(b) for b in loader) > 10_000
            assert loader.stats()["skipped"]["total"] == 0

def test_arguments_are_checked(seg_set):
    shards, _ = seg_set
    with pytest.raises(ValueError, match="mask="):
        fastfeed.Loader(shards, batch_size=4, device="cpu", mask="seg.png")  # classification has no mask
    with pytest.raises(ValueError, match="no \\['nope.png'\\] member"):
        fastfeed.Loader(shards, task="semantic", mask="nope.png", batch_size=4, device="cpu")
    with pytest.raises(ValueError, match="ignore_index"):
        fastfeed.Loader(shards, task="semantic", batch_size=4, device="cpu", ignore_index=-1)


def test_resume_and_determinism(seg_set):
    """Masks are a function of (seed, epoch, sample) like the pixels: a resumed Loader continues with the same
    batches."""
    shards, _ = seg_set

    def make():
        return fastfeed.Loader(shards, task="semantic", batch_size=4, image_size=S, device="cpu", seed=7,
                               dtype=torch.uint8)

    a = make()
    it = iter(a)
    first = [next(it) for _ in range(2)]
    state = a.state_dict()
    rest = list(it)
    a.close()
    b = make()
    b.load_state_dict(state)
    again = list(b)
    assert len(again) == len(rest) and len(rest) > 0
    for x, y in zip(rest, again):
        assert torch.equal(x["masks"], y["masks"]) and torch.equal(x["images"], y["images"])
    c = make()
    for x, y in zip(first, c):
        assert torch.equal(x["masks"], y["masks"])
    b.close()
    c.close()


def test_torchvision_deeplab_trains_on_the_batches(seg_set):
    """A real client: torchvision's deeplabv3_mobilenet_v3_large (no weights) with CrossEntropyLoss(ignore_index=
    255) on the Loader's float batches; the loss falls over a few steps on this small set."""
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large

    shards, _ = seg_set
    torch.manual_seed(0)
    model = deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=len(CLASS_HUES) + 1,
                                         aux_loss=False)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=IGNORE)
    loader = fastfeed.Loader(shards, task="semantic", batch_size=8, image_size=96, device="cpu",
                             augment=DetectAugment(mosaic=0.0, scale=0.2, **NO_HSV))
    assert loader.settings.mean != (0.0, 0.0, 0.0)  # ImageNet's normalisation, what the backbone expects
    losses = []
    model.train()
    for epoch in range(4):
        loader.set_epoch(epoch)
        for batch in loader:
            assert batch["images"].dtype == torch.float32
            loss = loss_fn(model(batch["images"])["out"], batch["masks"])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert np.isfinite(losses).all() and np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
    loader.close()


@pytest.mark.gpu
@pytest.mark.parametrize("decoder", ["cpu", "dali"])
def test_on_the_gpu_the_masks_are_the_cpu_ones(seg_set, decoder):
    """device="cuda": the masks are rendered from the same geometry as on the CPU (to the bit, int64 on the GPU)
    and still say what the pixels DALI decoded and the GPU renderer drew show."""
    shards, _ = seg_set
    kw = dict(task="semantic", batch_size=8, image_size=S, dtype=torch.uint8, seed=4,
              augment=DetectAugment(mosaic=0.5, **NO_HSV))
    cpu = fastfeed.Loader(shards, device="cpu", **kw)
    gpu = fastfeed.Loader(shards, device="cuda", decoder=decoder, **kw)
    assert gpu.settings.decoder == decoder
    n = 0
    for a, b in zip(cpu, gpu):
        assert b["masks"].is_cuda and b["masks"].dtype == torch.int64
        assert torch.equal(a["masks"], b["masks"].cpu())
        check_masks_against_pixels({"images": b["images"].cpu(), "masks": b["masks"].cpu()})
        n += 1
    assert n == len(cpu)
    cpu.close()
    gpu.close()


def test_evaluation_on_five_ranks_scores_every_image_once(seg_set):
    """train=False on 5 ranks (24 samples: 5 a rank, one of them padding): over the ranks, the valid positions are
    every sample exactly once, and a padded position's mask is all ignore_index."""
    shards, _ = seg_set
    scored, padded = [], 0
    for rank in range(5):
        loader = fastfeed.Loader(shards, task="semantic", batch_size=4, image_size=64, train=False, device="cpu",
                                 rank=rank, world_size=5, dtype=torch.uint8)
        for batch in loader:
            valid = batch["valid"]
            scored += batch["ids"][valid].tolist()
            padded += int((~valid).sum())
            assert (batch["masks"][~valid] == IGNORE).all()
            assert (batch["masks"][valid] != IGNORE).any(dim=(1, 2)).all()  # a scored image has labelled pixels
        loader.close()
    assert sorted(scored) == list(range(24)) and padded == 5 * 5 - 24
