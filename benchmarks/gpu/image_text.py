"""Image-text batches at 224 px from WebDataset shards: fastfeed on the adopted shards against DALI's
`fn.readers.webdataset` on the same shards, same decode and resize, same run.

    python benchmarks/gpu/image_text.py --workdir DIR [--num-images 5000] [--batch 256] [--seconds 20]
                                        [--threads 4] [--device cuda|cpu] [--no-check-row]
                                        [--variants JSON] [--json FILE] [--img2dataset-size N]

Data: `fastfeed.demo_data` photos (ImageNet-like, 300-800 px), each written with a caption (`.txt`), a JSON object and
a class into tar shards of 1,000 samples, laid out as webdataset's ShardWriter lays them out (written here with
`tarfile`: the GPU host has no webdataset package), then adopted by `fastfeed index` (which writes DALI's `.idx`
files beside them). `--img2dataset-size N`: each photo as img2dataset's default writes it (bench_image_text.py's
`img2dataset_jpeg`: fitted into N x N, black border, JPEG 95), the shards LAION-style downloads are.

DALI: `fn.readers.webdataset(ext=["jpg", "txt"])` with those index files, random shuffle, the captions as bytes, and
dali_reference.py's augmentation (`decoders.image_random_crop` on the hardware decoder, resize to 224, flip and
normalise to float16 CHW): the tuned reader fastfeed's classification tables compare against, with the caption
added. fastfeed: `Loader(fields=["txt"], dtype=float16)` with its defaults, warmed up (as the classification tables
are) until its online tuners (pipelines, the hybrid split) settle, at most `--max-warmup` batches. Both are read alone
(no model), each batch synchronised, in fresh Loaders one after the other, `--rounds` times. With `--device cpu` both run on DALI's CPU
backend and fastfeed's CPU path (a smoke test of the script anywhere). Numbers: benchmarks/README.md.
"""
from __future__ import annotations

import argparse
import glob
import io
import json
import os
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # dali_reference
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench_image_text

PER_SHARD = 1000


def prepare(workdir: Path, num_images: int, img2dataset_size: int | None = None) -> Path:
    """The shards (adopted by `fastfeed index` where they lie), made only when missing."""
    from bench_image_text import img2dataset_jpeg

    from fastfeed.demo_data import make_dataset
    from fastfeed.pack.index import index_shards

    shards = workdir / (f"image-text-{num_images}" + (f"-img2dataset-{img2dataset_size}" if img2dataset_size else ""))
    if (shards / "fastfeed.json").exists():
        return shards
    photos = sorted(make_dataset(workdir / f"photos-{num_images}", num_images=num_images, num_classes=10,
                                 seed=0).rglob("*.jpg"))[:num_images]
    shards.mkdir(parents=True, exist_ok=True)
    for s in range(0, len(photos), PER_SHARD):
        with tarfile.open(shards / f"shard-{s // PER_SHARD:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for i, path in enumerate(photos[s:s + PER_SHARD], start=s):
                key = f"{i:08d}"
                image = path.read_bytes()
                image = img2dataset_jpeg(image, img2dataset_size) if img2dataset_size else image
                members = {"jpg": image, "txt": f"a photo of a {path.parent.name}".encode(),
                           "json": json.dumps({"id": i}).encode(), "cls": str(hash(path.parent.name) % 10).encode()}
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size, info.mtime = len(data), 0
                    tar.addfile(info, io.BytesIO(data))
    index_shards(str(shards))
    return shards


def dali_loader(shards: Path, batch: int, threads: int, device_id: int | None):
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    from dali_reference import _augment

    tars = sorted(glob.glob(str(shards / "*.tar")))

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=device_id, seed=0, prefetch_queue_depth=2)
    def pipe():
        jpegs, txt = fn.readers.webdataset(paths=tars, index_paths=[t[:-4] + ".idx" for t in tars],
                                           ext=["jpg", "txt"], missing_component_behavior="error",
                                           random_shuffle=True, initial_fill=4096, name="Reader")
        images = _augment(fn, types, jpegs, image_size=224, device="mixed" if device_id is not None else "cpu",
                          hw_decoder_load=0.9)
        return images, fn.pad(txt, fill_value=0, shape=[96])  # captions as bytes, a fixed width to batch them

    p = pipe()
    p.build()
    it = DALIGenericIterator([p], ["images", "txt"], reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP,
                             auto_reset=True)

    def batches():
        while True:  # epoch after epoch (auto_reset)
            for out in it:
                images = out[0]["images"]
                captions = [bytes(row).rstrip(b"\0").decode() for row in out[0]["txt"].cpu().numpy()]
                yield images, captions

    return batches


def fastfeed_loader(shards: Path, batch: int, device: str, verify_checksums: bool = True, extra: dict | None = None):
    import torch

    import fastfeed

    loader = fastfeed.Loader(shards, batch_size=batch, image_size=224, device=device, dtype=torch.float16,
                             fields=["txt"], verify_checksums=verify_checksums, **(extra or {}))

    def batches():
        epoch = 0
        while True:
            loader.set_epoch(epoch)
            for b in loader:
                yield b["images"], b["txt"]
            epoch += 1

    return loader, batches


def measure(batches, seconds: float, warmup: int, device: str, settled=None, max_warmup: int = 0) -> dict:
    """`warmup` batches, then more while `settled()` (fastfeed's online tuners) is False, up to `max_warmup`, then
    as many batches as fit in `seconds`."""
    import torch

    it = iter(batches())
    done = 0
    while done < warmup or (settled is not None and done < max_warmup and not settled()):
        next(it)
        done += 1
    t0, n, steps = time.perf_counter(), 0, 0
    while time.perf_counter() - t0 < seconds:
        images, captions = next(it)
        assert len(captions) == len(images) and all(c.startswith("a photo of") for c in captions)
        if device == "cuda":
            torch.cuda.synchronize()
        n += len(images)
        steps += 1
    wall = time.perf_counter() - t0
    return {"images_per_s": n / wall, "batches": steps, "wall_s": wall, "warmup_batches": done}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--num-images", type=int, default=5000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--max-warmup", type=int, default=400,
                   help="fastfeed: more warm-up batches while its tuners settle, up to this many (as the tables do)")
    p.add_argument("--threads", type=int, default=4, help="DALI's threads")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--no-check-row", action="store_true",
                   help="also fastfeed with verify_checksums=False: what hashing each image beside its fields costs")
    p.add_argument("--variants", default="[]",
                   help="more fastfeed rows, each a JSON object of Loader arguments, e.g. '[{\"decoder\": \"dali\"}]'")
    p.add_argument("--json", type=Path)
    p.add_argument("--img2dataset-size", type=int, default=None)
    a = p.parse_args(argv)
    variants = {f"fastfeed {json.dumps(v, sort_keys=True)}": v for v in json.loads(a.variants)}
    shards = prepare(a.workdir, a.num_images, a.img2dataset_size)
    for f in shards.glob("*.tar"):  # the page cache warm for both
        f.read_bytes()
    print(f"{a.num_images} images, batch {a.batch}, 224 px, {len(os.sched_getaffinity(0))} cores, {a.device}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    rows = []
    names = ("dali", "fastfeed") + (("fastfeed-nocheck",) if a.no_check_row else ()) + tuple(variants)
    for r in range(a.rounds):
        for name in names:
            if name == "dali":
                got = measure(dali_loader(shards, a.batch, a.threads, 0 if a.device == "cuda" else None),
                              a.seconds, a.warmup, a.device)
            else:
                loader, batches = fastfeed_loader(shards, a.batch, a.device,
                                                  verify_checksums=name != "fastfeed-nocheck", extra=variants.get(name))
                got = measure(batches, a.seconds, a.warmup, a.device,
                              settled=lambda: loader.stats()["info"]["tuning_settled"], max_warmup=a.max_warmup)
                info = loader.stats()["info"]
                got.update(decoder=loader.settings.decoder, pipelines=info["pipelines"], settled=info["tuning_settled"])
                loader.close()
            rows.append(dict(got, loader=name, round=r))
            extra = f", {got['pipelines']} pipelines, {got['warmup_batches']} warm-up" if name != "dali" else ""
            print(f"round {r} {name:16s} {got['images_per_s']:9.1f} img/s  ({got['batches']} batches{extra})",
                  flush=True)
    mean = {n: sum(x["images_per_s"] for x in rows if x["loader"] == n) / a.rounds for n in names}
    for n in names[1:]:
        print(f"{n} / DALI webdataset reader: {mean[n] / mean['dali']:.2f}x", flush=True)
    if a.json:
        a.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
