"""Image-text batches at 224 px from WebDataset shards: fastfeed on the adopted shards against OpenCLIP's own
`get_wds_dataset` pipeline on the same shards, same run.

    python benchmarks/bench_image_text.py [--workdir DIR] [--num-images 3000] [--per-shard 500] [--batch-size 64]
                                          [--seconds 30] [--rounds 2] [--json F] [--baseline-python PY]
                                          [--img2dataset-size N]

Data: bench_index.py's shards (`fastfeed.demo_data` photos, 300-800 px, each with a caption, a JSON object and a
class, written by webdataset's ShardWriter: img2dataset's layout), adopted with `fastfeed index` for fastfeed.
`--img2dataset-size N`: the same samples with each photo as img2dataset writes it by default (`resize_mode=border`:
scaled to fit N x N with OpenCV's INTER_AREA, padded with black to N x N, JPEG quality 95), the shards most
LAION-style downloads are.

Baseline: `open_clip_train.data.get_wds_dataset` as OpenCLIP's trainer builds it for training (shard and sample
shuffle, webdataset's "pilrgb" decode, the RN50 train transform -- RandomResizedCrop(224, scale 0.9-1, bicubic),
ToTensor, Normalize with OpenAI's mean/std -- and the RN50 tokenizer in the workers), a DataLoader with 2 workers.
OpenCLIP's training extra pins webdataset<=0.2.86, so the baseline runs in its own interpreter (`--baseline-python`;
by default an environment made in the work folder: webdataset 0.2.86, pandas and braceexpand, on top of this
one's packages through a .pth file).

fastfeed: `Loader(fields=["txt"])` in training mode at 224 px, float32, OpenAI's mean/std, its own train transform
(torchvision's RandomResizedCrop, scale 0.08-1, bilinear, and a flip), and the same tokenizer on each batch's
captions in the loop, so both sides hand the training step images and token ids.

Each side runs in a fresh process, the rounds interleaved; the rate is samples over `--seconds` after the first
batches (`--warmup`). Numbers: benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_WORKDIR = Path(os.environ.get("TMPDIR", "/tmp")) / "fastfeed-bench" / "bench-image-text"
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


def run_fastfeed(data: str, batch_size: int, seconds: float, warmup: int) -> dict:
    import open_clip
    import torch

    import fastfeed

    tokenizer = open_clip.get_tokenizer("RN50")
    with fastfeed.Loader(data, batch_size=batch_size, image_size=224, train=True, device="cpu",
                         mean=OPENAI_MEAN, std=OPENAI_STD, fields=["txt"]) as loader:
        return _timed(((b["images"], tokenizer(b["txt"])) for epoch in range(1 << 30)
                       for b in _epoch(loader, epoch)), seconds, warmup,
                      {"settings": {k: str(v) for k, v in loader.settings.describe().items()}})


def _epoch(loader, epoch: int):
    loader.set_epoch(epoch)
    yield from loader


def run_openclip(shards: str, num_samples: int, batch_size: int, workers: int, seconds: float, warmup: int) -> dict:
    import open_clip
    from open_clip_train.data import get_wds_dataset

    args = argparse.Namespace(train_data=shards, val_data=None, train_num_samples=num_samples,
                              batch_size=batch_size, workers=workers, seed=0, world_size=1,
                              dataset_resampled=False, train_data_upsampling_factors=None)
    preprocess = open_clip.image_transform(224, is_train=True, mean=OPENAI_MEAN, std=OPENAI_STD)
    info = get_wds_dataset(args, preprocess, is_train=True, epoch=0, tokenizer=open_clip.get_tokenizer("RN50"))

    def batches():
        for epoch in range(1 << 30):
            info.set_epoch(epoch)
            yield from info.dataloader

    import webdataset

    return _timed(batches(), seconds, warmup, {"webdataset": webdataset.__version__})


def _timed(batches, seconds: float, warmup: int, extra: dict) -> dict:
    n = 0
    t0 = None
    for k, (images, tokens) in enumerate(batches):
        assert images.shape[1:] == (3, 224, 224) and len(tokens) == len(images)
        if k == warmup:
            t0 = time.perf_counter()
        elif k > warmup:
            n += len(images)
            if time.perf_counter() - t0 >= seconds:
                break
    return {"samples_per_s": n / (time.perf_counter() - t0), "samples": n, **extra}


def baseline_env(workdir: Path) -> str:
    """An interpreter with OpenCLIP's training pins over this one's packages (made once, with pip)."""
    env = workdir / "openclip-env"
    python = env / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "webdataset==0.2.86", "pandas", "braceexpand"],
                       check=True)
        site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        ours = [p for p in sys.path if p.endswith("site-packages")]
        # after the environment's own packages: webdataset 0.2.86 shadows this interpreter's webdataset
        Path(site, "zz_fastfeed_bench.pth").write_text("\n".join(ours) + "\n")
    return str(python)


def img2dataset_jpeg(data: bytes, size: int) -> bytes:
    """A JPEG as img2dataset's default resize_mode="border" writes it: scaled to fit size x size (OpenCV's
    INTER_AREA), padded with black to size x size, encoded at quality 95."""
    import cv2
    import numpy as np

    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    h, w = img.shape[:2]
    r = size / max(h, w)
    img = cv2.resize(img, (max(1, round(w * r)), max(1, round(h * r))), interpolation=cv2.INTER_AREA)
    top, left = (size - img.shape[0]) // 2, (size - img.shape[1]) // 2
    img = cv2.copyMakeBorder(img, top, size - img.shape[0] - top, left, size - img.shape[1] - left,
                             cv2.BORDER_CONSTANT, value=(0, 0, 0))
    return cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes()


def img2dataset_shards(shards: Path, size: int) -> Path:
    """`shards` with every jpg member as img2dataset writes it (img2dataset_jpeg)."""
    import tarfile

    import webdataset as wds

    out = shards.parent / f"{shards.name}-img2dataset-{size}"
    tars = sorted(shards.glob("*.tar"))
    if out.exists() and len(list(out.glob("*.tar"))) == len(tars):
        return out
    out.mkdir(parents=True, exist_ok=True)
    for t in tars:
        with tarfile.open(t) as src, wds.TarWriter(str(out / t.name)) as sink:
            samples: dict = {}
            for m in src:
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, {"__key__": key})[ext] = src.extractfile(m).read()
            for sample in samples.values():
                sample["jpg"] = img2dataset_jpeg(sample["jpg"], size)
                sink.write(sample)
    return out


def _side(argv: list[str], python: str = sys.executable) -> dict:
    proc = subprocess.run([python, str(Path(__file__).resolve()), *argv], capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:2]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    ap.add_argument("--num-images", type=int, default=3000)
    ap.add_argument("--per-shard", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="the baseline's DataLoader workers")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--warmup", type=int, default=5, help="batches before the clock starts")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--baseline-python", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--img2dataset-size", type=int, default=None)
    ap.add_argument("--side", choices=("fastfeed", "openclip"), help=argparse.SUPPRESS)  # a child's job
    ap.add_argument("--data", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.side == "fastfeed":
        print(json.dumps(run_fastfeed(a.data, a.batch_size, a.seconds, a.warmup)))
        return 0
    if a.side == "openclip":
        print(json.dumps(run_openclip(a.data, a.num_images, a.batch_size, a.workers, a.seconds, a.warmup)))
        return 0

    sys.path.insert(0, str(HERE))
    from bench_index import prepare

    from fastfeed.pack.index import index_shards

    a.workdir.mkdir(parents=True, exist_ok=True)
    shards = prepare(a.workdir, a.num_images, a.per_shard)
    if a.img2dataset_size:
        shards = img2dataset_shards(shards, a.img2dataset_size)
    adopted = a.workdir / f"adopted-{shards.name}"
    if not (adopted / "fastfeed.json").exists():
        index_shards(str(shards), str(adopted))
    tars = sorted(shards.glob("*.tar"))
    pattern = str(shards / f"shard-{{000000..{len(tars) - 1:06d}}}.tar")
    python = a.baseline_python or baseline_env(a.workdir)
    common = ["--batch-size", str(a.batch_size), "--seconds", str(a.seconds), "--warmup", str(a.warmup)]
    rows = []
    for r in range(a.rounds):
        base = _side(["--side", "openclip", "--data", pattern, "--num-images", str(a.num_images), "--workers",
                      str(a.workers), *common], python)
        ours = _side(["--side", "fastfeed", "--data", str(adopted), *common])
        rows.append({"round": r + 1, "openclip": base, "fastfeed": ours,
                     "ratio": ours["samples_per_s"] / base["samples_per_s"]})
        print(f"round {r + 1}: OpenCLIP get_wds_dataset ({a.workers} workers, webdataset {base['webdataset']}) "
              f"{base['samples_per_s']:.1f} samples/s, fastfeed {ours['samples_per_s']:.1f} samples/s: "
              f"{rows[-1]['ratio']:.2f}x", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                                            "args": {k: str(v) for k, v in vars(a).items()}, "rounds": rows},
                                           indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
