"""Detection training batches per second: `fastfeed.Loader(task="detect")` against ultralytics' own YOLO train
loader, same images, same augmentation, same cores, same run.

    python benchmarks/bench_detect.py [--workdir DIR] [--num-images 1000] [--photo-scale 1] [--variant NAME]
                                      [--batch 32] [--size 640] [--seconds 40] [--warmup 4] [--workers N]
                                      [--rounds 1] [--device cpu] [--mode train|val] [--json FILE]

Data: `fastfeed.demo_data.make_dataset` renders ImageNet-like JPEGs (300-800 px) into WORKDIR/yolo/images, each given
1-8 random boxes in WORKDIR/yolo/labels (YOLO text, 4 classes) and a data.yaml; the real CLI packs the folder
(`fastfeed pack WORKDIR/yolo WORKDIR/wds`). ultralytics reads the folder, fastfeed the shards. `--photo-scale K`
enlarges every photo K times per side first (into WORKDIR/xK): phone-camera sizes. `--variant` makes a kind of data
set the project does not ship out of the same photos and boxes (into WORKDIR/variant-NAME): `grey` (greyscale JPEGs),
`exif` (each photo stored turned 90 degrees with EXIF orientation 6, so it displays as before under its labels),
`png` (lossless PNGs), `small` (a third of the size per side: upscaled tiles), `crowd` (20-99 small boxes an image)
or `polygons` (each box's object a 12-39-point polygon inside it: both loaders do their segmentation batches,
ultralytics' `task=segment`, fastfeed's `task="segment"`).

Both loaders do ultralytics' default training augmentation (default.yaml: mosaic 1.0, translate 0.1, scale 0.5,
fliplr 0.5, HSV 0.015/0.7/0.4; mixup, copy-paste and rotation off, as there) at `--size` px and batch `--batch`
(`--mode val`: their evaluation batches instead, each image letterboxed to a square, in order), and
hand over uint8 [B, 3, S, S] images on the CPU with their boxes: ultralytics' `build_yolo_dataset` +
`build_dataloader` with `--workers` workers (default: the usable cores; `cache=False`, its default) and fastfeed's
`Loader(device="cpu", dtype=torch.uint8)` with its defaults (its threads = the usable cores). Each runs `--warmup`
untimed batches, then as many timed batches as fit in `--seconds`, one after the other (never together), ultralytics
first, in `--rounds` rounds; the page cache is warmed for both first. With `--device cuda` each batch ends on the GPU:
ultralytics' images and targets copied there as its trainer's `preprocess` does (non-blocking, then / 255), fastfeed's
Loader built with `device="cuda"` (it then applies the HSV gains there); each timed batch ends with a synchronise.
Needs ultralytics (`pip install ultralytics`). The cores are the process's: run under `taskset -c 0-3` for a rank's
share of a host.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

DEFAULT_WORKDIR = Path(os.environ.get("TMPDIR", "/tmp")) / "fastfeed-bench" / "bench-detect"
NAMES = ("a", "b", "c", "d")


def prepare_data(workdir: Path, num_images: int, photo_scale: int = 1) -> tuple[Path, Path]:
    """(YOLO folder, packed WebDataset folder) under `workdir`, made only when missing; `photo_scale` > 1 enlarges
    each photo that many times per side (bicubic, JPEG quality 90): phone-camera sizes, under workdir/xK."""
    if photo_scale > 1:
        return _enlarged(workdir, num_images, photo_scale)
    import numpy as np
    from PIL import Image

    from fastfeed.demo_data import make_dataset

    yolo, packed = workdir / "yolo", workdir / "wds"
    if _made(yolo, packed, num_images):
        return yolo, packed
    photos = make_dataset(workdir / "photos", num_images=num_images, num_classes=10, seed=0)
    (yolo / "images").mkdir(parents=True, exist_ok=True)
    (yolo / "labels").mkdir(exist_ok=True)
    (yolo / "data.yaml").write_text("names:\n" + "".join(f"  {i}: {n}\n" for i, n in enumerate(NAMES)))
    rng = np.random.default_rng(0)
    for i, src in enumerate(sorted(photos.rglob("*.jpg"))):
        dst = yolo / "images" / f"{i:06d}.jpg"
        if not dst.exists():
            os.link(src, dst)
        w, h = Image.open(dst).size
        lines = []
        for _ in range(int(rng.integers(1, 9))):
            bw, bh = rng.uniform(0.05, 0.5), rng.uniform(0.05, 0.5)
            cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
            lines.append(f"{int(rng.integers(0, len(NAMES)))} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}\n")
        (yolo / "labels" / f"{i:06d}.txt").write_text("".join(lines))
    return _pack(yolo, packed)


VARIANTS = ("grey", "exif", "png", "small", "crowd", "polygons")


def variant_data(workdir: Path, num_images: int, variant: str) -> tuple[Path, Path]:
    """(YOLO folder, packed folder) of `variant` (VARIANTS; the module docstring says what each is) under
    workdir/variant-NAME, made from `prepare_data`'s photos and boxes only when missing."""
    import math

    import numpy as np

    small, yolo, packed = _derived(workdir, f"variant-{variant}", num_images)
    if _made(yolo, packed, num_images):
        return yolo, packed
    rng = np.random.default_rng(1)
    sources = sorted((small / "images").iterdir())
    with ProcessPoolExecutor(len(os.sched_getaffinity(0))) as pool:  # (a PNG encode is ~75 ms a photo)
        list(pool.map(_variant_image, [variant] * len(sources), sources, [yolo / "images" / s.name for s in sources],
                      chunksize=16))
    for src in sources:
        lines = (small / "labels" / (src.stem + ".txt")).read_text().splitlines()
        if variant == "crowd":
            lines = []
            for _ in range(int(rng.integers(20, 100))):
                bw, bh = rng.uniform(0.01, 0.15), rng.uniform(0.01, 0.2)
                cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
                lines.append(f"{int(rng.integers(0, len(NAMES)))} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}")
        elif variant == "polygons":  # a star-shaped polygon inside each box
            polygons = []
            for line in lines:
                c, cx, cy, w, h = line.split()
                cx, cy, w, h = map(float, (cx, cy, w, h))
                t = np.linspace(0, 2 * math.pi, int(rng.integers(12, 40)), endpoint=False)
                r = rng.uniform(0.7, 1.0, len(t))
                xs, ys = np.clip(cx + r * w / 2 * np.cos(t), 0, 1), np.clip(cy + r * h / 2 * np.sin(t), 0, 1)
                polygons.append(c + "".join(f" {x:.5f} {y:.5f}" for x, y in zip(xs, ys)))
            lines = polygons
        (yolo / "labels" / (src.stem + ".txt")).write_text("".join(f"{line}\n" for line in lines))
    return _pack(yolo, packed)


def _variant_image(variant: str, src: Path, dst: Path) -> None:
    """The variant's image of the base photo `src`, written to `dst` (its suffix .png for `png`)."""
    from PIL import Image

    img = Image.open(src)
    if variant == "grey":
        img.convert("L").save(dst, quality=90)
    elif variant == "exif":
        turned = Image.Exif()
        turned[0x0112] = 6  # displayed turned 90 degrees clockwise: undoes the stored ROTATE_90
        img.transpose(Image.Transpose.ROTATE_90).save(dst, quality=90, exif=turned.tobytes())
    elif variant == "png":
        img.save(dst.with_suffix(".png"))
    elif variant == "small":
        img.resize((img.width // 3, img.height // 3), Image.BICUBIC).save(dst, quality=90)
    else:
        dst.write_bytes(src.read_bytes())


def _enlarged(workdir: Path, num_images: int, k: int) -> tuple[Path, Path]:
    from PIL import Image

    small, yolo, packed = _derived(workdir, f"x{k}", num_images)
    if _made(yolo, packed, num_images):
        return yolo, packed
    for src in sorted((small / "images").iterdir()):
        img = Image.open(src)
        img.resize((img.width * k, img.height * k), Image.BICUBIC).save(yolo / "images" / src.name, quality=90)
        label = small / "labels" / (src.stem + ".txt")
        (yolo / "labels" / label.name).write_bytes(label.read_bytes())
    return _pack(yolo, packed)


def _made(yolo: Path, packed: Path, num_images: int) -> bool:
    return (packed / "fastfeed.json").exists() and len(list((yolo / "labels").iterdir())) == num_images


def _derived(workdir: Path, folder: str, num_images: int) -> tuple[Path, Path, Path]:
    """(the base set's YOLO folder, a set derived from it: its YOLO folder, made with the base's data.yaml, and the
    folder it packs into), under workdir/folder."""
    small, _ = prepare_data(workdir, num_images)
    yolo, packed = workdir / folder / "yolo", workdir / folder / "wds"
    for sub in ("images", "labels"):
        (yolo / sub).mkdir(parents=True, exist_ok=True)
    (yolo / "data.yaml").write_bytes((small / "data.yaml").read_bytes())
    return small, yolo, packed


def _pack(yolo: Path, packed: Path) -> tuple[Path, Path]:
    """The real CLI packs a YOLO folder, as a user would."""
    subprocess.run([sys.executable, "-m", "fastfeed.cli", "pack", str(yolo), str(packed), "--shard-size", "64MB",
                    "--overwrite", "--quiet"], check=True)
    return yolo, packed


def ultralytics_loader(yolo: Path, batch: int, size: int, workers: int, mode: str = "train", task: str = "detect"):
    """ultralytics' train loader, or with mode "val" its evaluation one (LetterBox to size x size, no augmentation,
    in order; rect=False, so its batches are square like fastfeed's); task "segment": with its instance masks."""
    from ultralytics.cfg import get_cfg
    from ultralytics.data import build_dataloader, build_yolo_dataset

    cfg = get_cfg(overrides={"imgsz": size, "cache": False, "workers": workers, "task": task})
    data = {"names": dict(enumerate(NAMES)), "nc": len(NAMES), "channels": 3}
    dataset = build_yolo_dataset(cfg, str(yolo / "images"), batch, data, mode=mode, rect=False, stride=32)
    return build_dataloader(dataset, batch, workers, shuffle=mode == "train")


def fastfeed_loader(packed: Path, batch: int, size: int, device: str, extra: dict | None = None):
    import torch

    import fastfeed

    dtype = torch.uint8 if device == "cpu" else torch.float16
    return fastfeed.Loader(packed, batch_size=batch, image_size=size, device=device, dtype=dtype, **(extra or {}))


def to_device_ultralytics(batch: dict, device: str) -> int:
    """ultralytics' DetectionTrainer.preprocess: the images to the device, / 255, half; the targets with them."""
    import torch

    if device != "cpu":
        img = batch["img"].to(device, non_blocking=True).half() / 255
        for k in ("cls", "bboxes", "batch_idx"):
            batch[k].to(device, non_blocking=True)
        torch.cuda.synchronize()
        return len(img)
    return len(batch["img"])


def to_device_fastfeed(batch: dict, device: str) -> int:
    import torch

    if device != "cpu":
        torch.cuda.synchronize()
    return len(batch["images"])


def measure(loader, images_of, warmup: int, seconds: float) -> dict:
    """Batches drawn over epochs: `warmup` untimed, then timed until `seconds` pass."""
    def batches():
        while True:
            yield from loader

    it = batches()
    for _ in range(warmup):
        next(it)
    cpu0, t0 = time.process_time(), time.perf_counter()
    n = steps = 0
    while time.perf_counter() - t0 < seconds:
        n += images_of(next(it))
        steps += 1
    wall = time.perf_counter() - t0
    return {"images_per_s": n / wall, "batches": steps, "wall_s": wall}


def main(argv=None) -> int:
    a, yolo, packed = start(__doc__, argv, device=True, more=lambda p: p.add_argument(
        "--mode", choices=("train", "val"), default="train",
        help="val: evaluation batches (letterbox, no augmentation, in order) on both sides"))
    train = a.mode == "train"
    task = "segment" if a.variant == "polygons" else "detect"
    extra = dict(a.loader_kwargs, task=task) if train else dict(a.loader_kwargs, task=task, train=False)
    run_rounds({"ultralytics": lambda: (ultralytics_loader(yolo, a.batch, a.size, a.workers, a.mode, task),
                                        lambda b: to_device_ultralytics(b, a.device)),
                "fastfeed": lambda: (fastfeed_loader(packed, a.batch, a.size, a.device, extra),
                                     lambda b: to_device_fastfeed(b, a.device))}, a)
    return 0


def start(doc: str, argv, *, device: bool, more=None) -> tuple[argparse.Namespace, Path, Path]:
    """The comparison scripts' common start (this one's and bench_ssd.py's): their arguments (`--device` when
    `device`), the data set made or found, its files read once so the page cache is warm for both sides, and the
    header line; `more(parser)` adds the caller's own arguments. Returns (arguments, YOLO folder, packed folder)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    p.add_argument("--num-images", type=int, default=1000)
    p.add_argument("--photo-scale", type=int, default=1,
                   help="enlarge each photo K times per side (K=6: 2-12 MP, phone-camera sizes)")
    p.add_argument("--variant", choices=VARIANTS, help="another kind of data set (the module docstring says which)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=640)
    p.add_argument("--seconds", type=float, default=40)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--loader-kwargs", type=json.loads, default={},
                   help='more fastfeed.Loader arguments, as JSON: e.g. \'{"pipelines": 2}\'')
    if device:
        p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path)
    if more is not None:  # the caller's own arguments
        more(p)
    a = p.parse_args(argv)
    if a.variant and a.photo_scale > 1:
        p.error("--variant and --photo-scale are separate data sets: give one")
    yolo, packed = (variant_data(a.workdir, a.num_images, a.variant) if a.variant
                    else prepare_data(a.workdir, a.num_images, a.photo_scale))
    for f in [*yolo.rglob("*"), *packed.rglob("*")]:
        if f.is_file():
            f.read_bytes()
    where = f"{a.device}, " if device else ""
    print(f"{a.variant + ' ' if a.variant else ''}{a.num_images} images, batch {a.batch}, {a.size} px, {len(os.sched_getaffinity(0))} cores, {where}"
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return a, yolo, packed


def run_rounds(runs: dict, a) -> list[dict]:
    """`runs`: name -> () -> (a fresh loader, images_of(batch)), the baseline first, then fastfeed. Each is measured
    one after the other (`measure`), `a.rounds` times; prints each row and fastfeed's ratio to the baseline, writes
    `a.json` when given. A loader with `close()` is closed after its row."""
    rows = []
    for r in range(a.rounds):
        for name, make in runs.items():
            loader, images_of = make()
            got = measure(loader, images_of, a.warmup, a.seconds)
            getattr(loader, "close", lambda: None)()
            del loader
            rows.append(dict(got, loader=name, round=r))
            print(f"round {r} {name:12s} {got['images_per_s']:8.1f} img/s  ({got['batches']} batches)", flush=True)
    base = next(iter(runs))
    mean = {n: sum(x["images_per_s"] for x in rows if x["loader"] == n) / a.rounds for n in (base, "fastfeed")}
    print(f"fastfeed / {base}: {mean['fastfeed'] / mean[base]:.2f}x")
    if a.json:
        a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    sys.exit(main())
