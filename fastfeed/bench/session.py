"""One `fastfeed bench` run: build each loader, measure it with the same consumer, assemble the report.

Loaders run one after the other (never concurrently: they would fight for the same cores and disk), each closed
before the next starts. `run_bench` takes optional loader factories so other loaders (or tests) plug in.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from fastfeed.constants import DTYPE_NAMES

__all__ = ["BenchConfig", "run_bench", "resolve_images_dir", "fit_batch_size", "DTYPES"]

DTYPES = DTYPE_NAMES  # the names `--dtype` takes


@dataclass
class BenchConfig:
    """Options of one bench run; the loader-shaped ones map one to one onto `fastfeed.Loader` arguments."""

    dataset: str | None
    images: str | None = None
    batch_size: int = 256
    image_size: int = 224
    decoder: str = "auto"
    device: str | None = None
    dtype: str = "float32"
    channels_last: bool = False
    num_threads: int | str | None = None
    prefetch: int | None = None
    pipelines: int | None = None
    reader_threads: int | None = None
    hw_decoder_load: float | None = None
    train: bool = True
    steps: int = 50
    warmup: int = 10
    # A Loader still tuning itself on the loop (its pipeline count, the hybrid's CPU share) is warmed up until both
    # have settled, up to this many steps (runner.still_tuning).
    max_warmup: int = 500
    consumer: str = "none"
    compare: str | None = None
    torch_workers: int | None = None
    seed: int = 0

    def validate(self) -> None:
        for name in ("batch_size", "image_size", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "max_warmup"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        for name in ("prefetch", "pipelines", "reader_threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hw_decoder_load is not None and not 0.0 <= self.hw_decoder_load <= 1.0:
            raise ValueError(f"hw_decoder_load must be in [0, 1], got {self.hw_decoder_load}")
        if self.compare not in (None, "torch"):
            raise ValueError(f"--compare supports only 'torch', got {self.compare!r}")


def resolve_images_dir(dataset: str | None, images: str | None) -> Path:
    """What the torch baseline reads: `images` (an unpacked ImageFolder tree) if given, else the packed dataset.

    By default the baseline reads the packed samples (through fastfeed.open_dataset), so both loaders measure the
    same images: the source folder may hold files pack rejected, or be gone.
    """
    if images:
        p = Path(images)
        if not p.is_dir():
            raise FileNotFoundError(f"--images {images}: not a directory")
        return p
    if not dataset:
        raise ValueError("the torch baseline needs a packed DATASET or --images DIR")
    manifest = Path(dataset) / "fastfeed.json"
    if not manifest.is_file():
        raise ValueError(f"{dataset}: no fastfeed.json, not a packed dataset (`fastfeed pack` writes one); "
                         "pass --images DIR to give the baseline an image folder")
    return Path(dataset)


def fit_batch_size(batch_size: int, num_samples: int) -> tuple[int, str | None]:
    """The batch size a run can use on `num_samples` images, and a note when it had to be lowered.

    Both loaders drop the last partial batch when training; a dataset smaller than one batch would give none.
    """
    if num_samples < 1:
        raise ValueError("the dataset holds no samples")
    if num_samples >= batch_size:
        return batch_size, None
    return num_samples, (f"the dataset holds {num_samples} samples, fewer than --batch-size {batch_size}: measured "
                         f"with batch size {num_samples} (one batch per epoch, so every step also starts an "
                         "epoch; pass a smaller --batch-size to measure steady state)")


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _default_device(device: str | None) -> str:
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def _fastfeed_factory(cfg: BenchConfig, device: str) -> Callable[[], Iterable]:
    def make():
        from fastfeed.loader.loader import Loader

        return Loader(cfg.dataset, batch_size=cfg.batch_size, train=cfg.train, image_size=cfg.image_size,
                      device=device, decoder=cfg.decoder, dtype=_torch_dtype(cfg.dtype),
                      channels_last=cfg.channels_last, seed=cfg.seed,
                      num_threads="auto" if cfg.num_threads is None else cfg.num_threads,
                      prefetch=cfg.prefetch, pipelines=cfg.pipelines, reader_threads=cfg.reader_threads,
                      hw_decoder_load=cfg.hw_decoder_load)

    return make


def _torch_factory(cfg: BenchConfig, device: str, images: Path) -> Callable[[], Iterable]:
    def make():
        from fastfeed.bench.torch_baseline import make_torch_loader

        return make_torch_loader(images, batch_size=cfg.batch_size, image_size=cfg.image_size, train=cfg.train,
                                 device=device, dtype=_torch_dtype(cfg.dtype), channels_last=cfg.channels_last,
                                 num_workers=cfg.torch_workers, seed=cfg.seed)

    return make


def _num_classes(cfg: BenchConfig, images: Path | None) -> int:
    if cfg.dataset:
        try:
            raw = json.loads((Path(cfg.dataset) / "fastfeed.json").read_text())
            return max(1, len(raw.get("classes") or ())) if isinstance(raw, dict) else 1000
        except (OSError, ValueError):
            pass
    if images is not None:
        return max(1, sum(1 for p in images.iterdir() if p.is_dir()))
    return 1000


def run_bench(cfg: BenchConfig, loaders: dict[str, Callable[[], Iterable]] | None = None,
              progress: bool = True, log: Callable[[str], None] | None = None) -> dict:
    """Measure every loader (default: fastfeed, plus torch with compare='torch') and return the report dict.

    The first loader is the one being measured: its failure raises. A later one (the baseline) that fails is
    reported under `errors` and the run goes on, so the first loader's numbers are never lost. `log` receives
    notes as they happen (the CLI prints them to stderr).
    """
    from fastfeed.bench.consumers import make_consumer, synthetic_batch
    from fastfeed.bench.report import build_report
    from fastfeed.bench.runner import percentiles, run_compute_only

    cfg.validate()
    device = _default_device(cfg.device)
    images = None
    notes: list[str] = []
    if loaders is None:
        if not cfg.dataset:
            raise ValueError("a packed DATASET is required")
        from fastfeed.remote import read_manifest  # a folder or a dataset URL, as the Loader takes

        manifest = read_manifest(cfg.dataset)
        task = manifest.task
        if task != "classify" and (cfg.consumer != "none" or cfg.compare == "torch"):
            raise ValueError(f"{cfg.dataset} is a {task!r} dataset: bench measures its loader alone (--consumer "
                             "none, no --compare); the model consumers and the DataLoader baseline are a classifier's")
        cfg.batch_size, note = fit_batch_size(cfg.batch_size, manifest.num_samples)
        if note:
            notes.append(note)
            if log:
                log(note)
        loaders = {"fastfeed": _fastfeed_factory(cfg, device)}
        if cfg.compare == "torch":
            images = resolve_images_dir(cfg.dataset, cfg.images)
            loaders["torch"] = _torch_factory(cfg, device, images)
    num_classes = _num_classes(cfg, images)
    consumer = make_consumer(cfg.consumer, device, num_classes=num_classes)
    gpu_index = None
    if device.startswith("cuda"):
        import torch

        gpu_index = torch.device(device).index
        gpu_index = torch.cuda.current_device() if gpu_index is None else gpu_index

    results, errors = {}, {}
    for i, (name, factory) in enumerate(loaders.items()):
        try:
            results[name], note = _measure(name, factory, consumer, cfg, gpu_index, progress)
            if note:
                notes.append(note)
                if log:
                    log(note)
        except KeyboardInterrupt:
            raise
        except Exception as e:  # the baseline may fail in many ways (a worker's decode error, OOM, ...)
            if i == 0:
                raise
            errors[name] = _one_line(e)
            if log:
                log(f"{name} failed, the report has the other loaders' numbers: {errors[name]}")

    compute = None
    if cfg.consumer != "none":
        batch = synthetic_batch(cfg.batch_size, cfg.image_size, device, _torch_dtype(cfg.dtype), num_classes)
        compute = percentiles(run_compute_only(consumer, batch, steps=cfg.steps, warmup=min(cfg.warmup, 5) or 1))
    config = {**asdict(cfg), "device": device}
    return build_report(config, results, cfg.consumer, compute, cfg.batch_size, errors=errors, notes=notes,
                        baseline_source=os.fspath(images) if images is not None else None)


def _one_line(e: BaseException) -> str:
    """An exception as one report line; a DataLoader worker's multi-line message keeps its first and last lines
    ("Caught ValueError in DataLoader worker process 0" ... "ValueError: <the sample that failed>")."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if len(lines) > 1:
        return f"{type(e).__name__}: {lines[0].rstrip('.')}: {lines[-1]}"
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def _measure(name: str, factory: Callable[[], Iterable], consumer, cfg: BenchConfig, gpu_index: int | None,
             progress: bool) -> tuple[dict, str | None]:
    """One loader's result, and a note when it warmed up longer than asked (it was still tuning itself)."""
    from fastfeed.bench.runner import run_loader

    loader = factory()
    try:
        res = run_loader(loader, consumer, name=name, steps=cfg.steps, warmup=cfg.warmup, gpu_index=gpu_index,
                         progress=progress, max_warmup=cfg.max_warmup)
    finally:
        if hasattr(loader, "close"):
            loader.close()
    note = None
    if res.warmup_steps >= cfg.max_warmup > cfg.warmup:
        note = (f"{name}: its online tuning (pipeline count, CPU share) had not settled after {res.warmup_steps} "
                "warm-up steps (--max-warmup): the timed steps include its tries")
    elif res.warmup_steps > cfg.warmup:
        note = (f"{name} warmed up {res.warmup_steps} steps (asked {cfg.warmup}), until its online tuning (pipeline "
                "count, CPU share) settled")
    built = ((res.loader_stats or {}).get("counters") or {}).get("pipelines_built", 0)
    if built:
        # The tuner was still trying pipelines: the rate includes a try, the build and the new pipeline's first
        # batches, which a short run cannot average out.
        built_note = (f"{name}: {built} decode pipeline{'s' if built > 1 else ''} built during the timed steps; "
                      "the pipeline tuner was still trying, and this rate includes its try: time more steps "
                      "(--steps) for the steady state")
        note = f"{note}; {built_note}" if note else built_note
    return res.to_dict(), note
