"""`Loader(task="segment")` end to end on the CPU: a YOLO folder with polygon segments, packed by the CLI, read back as
detection batches with instance masks. The oracle does not trust the implementation: every object is a solid
rectangle or triangle of its class's colour on grey, so after any augmentation each object's mask must lie under its
colour, its colour within its box must be its mask, and a rectangle's mask must span its box.
"""
from __future__ import annotations

import colorsys

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw
from test_detect_loader import CLASS_HUES, NAMES, colour_classes
from test_segment_loader import interior

import fastfeed
from fastfeed.detect import DetectAugment
from fastfeed.detect.clients import to_torchvision, to_ultralytics

S = 128
NO_HSV = dict(hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)


def make_yolo_segments(root, n: int = 20, seed: int = 0) -> None:
    """A YOLO folder of n PNG scenes, each with 1-3 non-overlapping objects (rectangles and triangles) labelled by
    their polygons (YOLO segment lines)."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    (root / "data.yaml").write_text("names:\n" + "".join(f"  {i}: {name}\n" for i, name in enumerate(NAMES)))
    for i in range(n):
        w, h = int(rng.integers(80, 300)), int(rng.integers(80, 300))
        img = Image.new("RGB", (w, h), (int(rng.integers(30, 200)),) * 3)
        draw = ImageDraw.Draw(img)
        placed, lines = [], []
        for _ in range(int(rng.integers(1, 4))):
            bw, bh = int(rng.integers(16, max(17, w // 2))), int(rng.integers(16, max(17, h // 2)))
            x0, y0 = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
            if any(x0 < b[2] + 4 and b[0] < x0 + bw + 4 and y0 < b[3] + 4 and b[1] < y0 + bh + 4 for b in placed):
                continue
            c = int(rng.integers(0, len(CLASS_HUES)))
            colour = tuple(int(round(v * 255)) for v in colorsys.hsv_to_rgb(CLASS_HUES[c], 1.0, 0.9))
            if rng.random() < 0.5:  # a rectangle: pixels [x0, x0 + bw) x [y0, y0 + bh)
                poly = [(x0, y0), (x0 + bw, y0), (x0 + bw, y0 + bh), (x0, y0 + bh)]
                draw.rectangle((x0, y0, x0 + bw - 1, y0 + bh - 1), fill=colour)
            else:  # a triangle, its height 0.7-1.4 its base: no vertex so sharp that pixel centres miss it by far
                bh = min(bh, int(bw * 1.4), h - y0) if bh > bw else max(bh, int(bw * 0.7))
                if y0 + bh > h or any(y0 < b[3] + 4 and b[1] < y0 + bh + 4 and x0 < b[2] + 4 and b[0] < x0 + bw + 4
                                      for b in placed):
                    continue
                poly = [(x0, y0 + bh), (x0 + bw / 2, y0), (x0 + bw, y0 + bh)]
                draw.polygon(poly, fill=colour)
            placed.append((x0, y0, x0 + bw, y0 + bh))
            lines.append(f"{c} " + " ".join(f"{x / w:.6f} {y / h:.6f}" for x, y in poly) + "\n")
        img.save(root / "images" / f"im{i:03d}.png")
        (root / "labels" / f"im{i:03d}.txt").write_text("".join(lines))


@pytest.fixture(scope="module")
def seg_pack(tmp_path_factory):
    from conftest import run_pack

    root = tmp_path_factory.mktemp("yoloseg")
    make_yolo_segments(root / "src")
    run_pack(root / "src", root / "out", "--format", "wds")
    return root / "out"


def check_instances_against_pixels(batch: dict, rotated: bool = False, outlines: bool = True) -> int:
    """The oracle, per object: its mask's steady pixels are its class's pure colour; its class's pure colour inside
    its box (objects never overlap) is its mask; a mask lies in its box and spans it (±1.5 px). An object with an
    outline (`outlines`: polygons) has the bounds of what its tile shows of it as its box, a triangle's too, cut or
    turned; one with an RLE mask the turned box's bounds, which a mask spans only as a rectangle and unturned.
    Returns the number of objects checked."""
    images, masks = batch["images"], batch["masks"].numpy()
    assert masks.dtype == np.int16 and masks.shape == (len(images), *images.shape[2:])
    rgb = images.permute(0, 2, 3, 1).numpy().astype(np.int16)
    sat = (rgb.max(-1) - rgb.min(-1)) / np.maximum(rgb.max(-1), 1)
    pure = np.where(sat > 0.85, colour_classes(images), -1)
    steady = interior(masks)
    checked = 0
    for k in range(len(images)):
        mine = (batch["batch_idx"] == k).numpy()
        boxes, labels = batch["boxes"][mine].numpy(), batch["labels"][mine].numpy()
        assert set(np.unique(masks[k]).tolist()) <= set(range(len(boxes) + 1))
        for i, ((x0, y0, x1, y1), c) in enumerate(zip(boxes, labels)):
            region = masks[k] == i + 1
            if not region.any():  # an outline a few pixels across, or a box cut to a sliver, may paint nothing
                small = min(x1 - x0, y1 - y0) < 4 if outlines else (x1 - x0) * (y1 - y0) < 40 or rotated
                assert small, (k, i, (x0, y0, x1, y1))
                continue
            assert (pure[k][steady[k] & region] == c).all(), f"image {k}: mask {i} off its colour"
            xa, ya, xb, yb = int(np.ceil(x0)) + 1, int(np.ceil(y0)) + 1, int(x1) - 1, int(y1) - 1
            inside = np.zeros_like(region)
            inside[ya:yb, xa:xb] = True
            colour_in_box = inside & interior(np.where(pure == c, 1, 0).astype(np.int8))[k] & (pure[k] == c)
            # a rotated box may reach over another object of the class: its colour there is in that one's mask
            colour_in_box &= ~((masks[k] > 0) & ~region)
            assert region[colour_in_box].all(), f"image {k}: colour of object {i} outside its mask"
            ys, xs = np.nonzero(region)
            got = np.array((xs.min(), ys.min(), xs.max() + 1, ys.max() + 1))
            assert (got[:2] >= (x0 - 1, y0 - 1)).all() and (got[2:] <= (x1 + 1, y1 + 1)).all(), (k, i, got)
            rectangle = region.sum() > 0.95 * (got[2] - got[0]) * (got[3] - got[1])
            if outlines or rectangle and not rotated:  # pixel centres may miss a vertex's tip by up to 2 px
                assert np.allclose(got, (x0, y0, x1, y1), atol=1.5 if rectangle else 3.5), (k, i, got, (x0, y0, x1, y1))
            checked += 1
    return checked


@pytest.mark.parametrize("augment", [DetectAugment(**NO_HSV), DetectAugment(mosaic=0.0, fliplr=1.0, **NO_HSV),
                                     DetectAugment(mosaic=0.5, degrees=20.0, shear=5.0, **NO_HSV),
                                     DetectAugment(flipud=0.5, **NO_HSV)],
                         ids=["mosaic", "letterbox-flip", "rotate-shear", "flipud"])
def test_instance_masks_follow_the_pixels(seg_pack, augment):
    loader = fastfeed.Loader(seg_pack, task="segment", batch_size=8, image_size=S, dtype=torch.uint8, device="cpu",
                             augment=augment, seed=2)
    checked = 0
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            checked += check_instances_against_pixels(batch, rotated=not augment.axis_aligned)
    assert checked > 40
    loader.close()


def test_evaluation_masks_and_the_clients(seg_pack):
    """The letterbox; torchvision's targets get one binary mask per box, ultralytics' batch the index map (or, for
    overlap_mask=False, the same binary masks in the boxes' order)."""
    loader = fastfeed.Loader(seg_pack, task="segment", batch_size=8, image_size=S, dtype=torch.uint8, device="cpu",
                             train=False)
    for batch in loader:
        assert check_instances_against_pixels(batch) > 0
        _, targets = to_torchvision(batch)
        for k, t in enumerate(targets):
            assert t["masks"].dtype == torch.uint8 and t["masks"].shape == (len(t["boxes"]), S, S)
            for i in range(len(t["boxes"])):
                assert torch.equal(t["masks"][i].bool(), batch["masks"][k] == i + 1)
        full = to_ultralytics(batch, mask_ratio=1)
        assert torch.equal(full["masks"], batch["masks"])
        per_box = to_ultralytics(batch, overlap_mask=False, mask_ratio=1)["masks"]  # box i's mask, in boxes' order
        assert torch.equal(per_box, torch.cat([t["masks"] for t in targets]))
        # its default mask_ratio 4: 1/4 the side, each pixel the one nearest its centre
        assert torch.equal(to_ultralytics(batch)["masks"], batch["masks"][:, 2::4, 2::4])
        assert torch.equal(to_ultralytics(batch, overlap_mask=False)["masks"], per_box[:, 2::4, 2::4])
    loader.close()


def test_segment_needs_polygons(tmp_path, caplog):
    """A boxes-only set is refused for instance masks, without first warning that its masks will come out empty
    (found by an adversarial run)."""
    from conftest import run_pack
    from test_detect_loader import make_yolo

    make_yolo(tmp_path / "src", n=4)
    run_pack(tmp_path / "src", tmp_path / "out", "--format", "wds")
    with caplog.at_level("WARNING", logger="fastfeed"), pytest.raises(ValueError, match="polygons"):
        fastfeed.Loader(tmp_path / "out", task="segment", batch_size=2, device="cpu")
    assert [r.getMessage() for r in caplog.records if "empty instance masks" in r.getMessage()] == []


def test_objects_without_an_outline_are_named_and_get_empty_masks(tmp_path, caplog):
    """A partly segmented set (some label lines boxes, the rest polygons, as ultralytics reads both): the Loader
    warns once with the count and the first sample, and exactly those objects come with empty masks."""
    from conftest import run_pack

    make_yolo_segments(tmp_path / "src", n=8, seed=2)
    boxes_only = 0
    for k, f in enumerate(sorted((tmp_path / "src" / "labels").iterdir())):
        lines = f.read_text().splitlines()
        if k % 2:  # the first object of every other image as a box line
            c, *xy = lines[0].split()
            xs, ys = [float(v) for v in xy[0::2]], [float(v) for v in xy[1::2]]
            lines[0] = (f"{c} {(min(xs) + max(xs)) / 2:.6f} {(min(ys) + max(ys)) / 2:.6f} "
                        f"{max(xs) - min(xs):.6f} {max(ys) - min(ys):.6f}")
            boxes_only += 1
        f.write_text("".join(f"{line}\n" for line in lines))
    run_pack(tmp_path / "src", tmp_path / "out", "--format", "wds")
    with caplog.at_level("WARNING", logger="fastfeed"):
        loader = fastfeed.Loader(tmp_path / "out", task="segment", batch_size=4, image_size=S, device="cpu",
                                 train=False, dtype=torch.uint8)
    notes = [r.getMessage() for r in caplog.records if "no polygon or mask" in r.getMessage()]
    assert len(notes) == 1 and f" {boxes_only} of " in notes[0], notes
    empty = 0
    for batch in loader:
        _, targets = to_torchvision(batch)
        for t in targets:
            pixels = t["masks"].flatten(1).sum(1)
            empty += int((pixels == 0).sum())
    assert empty == boxes_only
    loader.close()


@pytest.mark.gpu
def test_on_the_gpu_the_instance_masks_are_the_cpu_ones(seg_pack):
    """decoder="dali" (DALI and the GPU renderer draw the pixels): the same boxes and index maps as on the CPU,
    and the maps still follow the pixels drawn on the GPU."""
    kw = dict(task="segment", batch_size=8, image_size=S, dtype=torch.uint8, seed=4,
              augment=DetectAugment(**NO_HSV))
    cpu = fastfeed.Loader(seg_pack, device="cpu", **kw)
    gpu = fastfeed.Loader(seg_pack, device="cuda", decoder="dali", **kw)
    for a, b in zip(cpu, gpu):
        assert torch.equal(a["boxes"], b["boxes"].cpu()) and torch.equal(a["masks"], b["masks"].cpu())
        check_instances_against_pixels({k: v.cpu() if torch.is_tensor(v) else v for k, v in b.items()})
    cpu.close()
    gpu.close()


@pytest.mark.integration  # a Mask R-CNN on the CPU
def test_a_torchvision_mask_rcnn_trains_on_the_batches(seg_pack):
    """A real client: torchvision's maskrcnn_resnet50_fpn (no weights) takes to_torchvision's targets, masks
    included, and its mask loss is computed from them."""
    from torchvision.models.detection import maskrcnn_resnet50_fpn

    torch.manual_seed(0)
    model = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=len(NAMES) + 1, min_size=S,
                                  max_size=S, trainable_backbone_layers=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.005, momentum=0.9)
    loader = fastfeed.Loader(seg_pack, task="segment", batch_size=4, image_size=S, device="cpu",
                             augment=DetectAugment(mosaic=0.0, **NO_HSV))
    model.train()
    steps = 0
    for batch in loader:
        images, targets = to_torchvision(batch, label_offset=1)
        if not all(len(t["boxes"]) for t in targets):
            continue
        losses = model(images, targets)
        assert set(losses) >= {"loss_mask", "loss_box_reg", "loss_classifier"}
        assert all(torch.isfinite(v) for v in losses.values()) and losses["loss_mask"] > 0
        opt.zero_grad()
        sum(losses.values()).backward()
        opt.step()
        steps += 1
        if steps == 3:
            break
    assert steps == 3
    loader.close()


@pytest.mark.integration  # YOLOv8n-seg on the CPU
def test_ultralytics_segmentation_loss_trains_on_the_batches(seg_pack, monkeypatch):
    """A real client: ultralytics' SegmentationModel (yolov8n-seg from its yaml, no weights) and its own
    v8SegmentationLoss (overlap masks, its default) take to_ultralytics' batches and train on them (that each map
    holds the right objects is the oracle tests' business above)."""
    # Importing ultralytics replaces PIL.Image.open for the whole process (a HEIF fallback that pip-installs
    # pi-heif); put PIL's back after this test, so later tests in this worker see PIL's own errors.
    import PIL.Image

    monkeypatch.setattr(PIL.Image, "open", PIL.Image.open)
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import SegmentationModel

    torch.manual_seed(0)
    model = SegmentationModel("yolov8n-seg.yaml", nc=len(NAMES), verbose=False)
    model.args = get_cfg()  # the loss gains and overlap_mask=True, as its trainer sets them
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    loader = fastfeed.Loader(seg_pack, task="segment", batch_size=4, image_size=S, device="cpu", dtype=torch.uint8)
    for step, batch in zip(range(3), loader):
        b = to_ultralytics(batch)
        b["img"] = b["img"].float() / 255  # its trainer's preprocess
        loss, items = model.loss(b)
        assert torch.isfinite(loss).all() and items["seg_loss"] > 0, items
        loss.sum().backward()
        opt.step()
        opt.zero_grad()
    assert step == 2
    loader.close()
