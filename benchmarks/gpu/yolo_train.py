"""YOLOv8 training steps per second with one input feed, in this process: the issue's measure of whether the GPU
waits for data.

    python benchmarks/gpu/yolo_train.py --feed FEED [--model yolov8n.yaml] [--batch 64]
                                        [--size 640] [--steps 100] [--warmup 30] [--workdir DIR] [--variant NAME]
                                        [--json FILE]

The model is ultralytics' DetectionModel built from its yaml (no weights, 4 classes), trained with ultralytics' own
loss (v8DetectionLoss, its default gains), SGD (lr 0.01, momentum 0.937, nesterov), bf16 autocast, batch 64 at 640
px, as its DetectionTrainer steps; each step's batch goes through the trainer's `preprocess` (to the GPU, float,
/ 255). Feeds, all with ultralytics' default training augmentation (mosaic, scale/translate, HSV, flip):
  resident     one batch of ultralytics' loader, kept on the GPU and reused: the ceiling, no input cost at all;
  ultralytics  ultralytics' own train loader (build_yolo_dataset + build_dataloader), workers = the usable cores;
  fastfeed     fastfeed.Loader(task="detect", dtype=uint8, device="cuda") with its defaults, through
               fastfeed.detect.clients.to_ultralytics.
Two more, to tell where a gap between fastfeed and the ceiling comes from (not feeds a user would pick):
  resident+fastfeed        the resident batch is trained on, and each step also takes one fastfeed batch (to
                           the GPU, through to_ultralytics) and drops it: the loader's whole cost, in this process;
  resident+fastfeed-apart  the resident batch, with the same loader taking batches at the resident pace in another
                           process on the same cores and GPU: its CPU and GPU work without sharing this one's GIL.
Run each feed in its own process under `taskset -c 0-(N-1)` for a rank's N cores (run.sh's `yolo-train` step).
Data: benchmarks/bench_detect.py's (ImageNet-like JPEGs, 1-8 boxes each, YOLO layout and its fastfeed pack), or with
`--variant` one of its kinds of data the project does not ship (`png`, ...).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_detect import DEFAULT_WORKDIR, VARIANTS, prepare_data, ultralytics_loader, variant_data  # noqa: E402


def fastfeed_loader(packed: Path, batch: int, size: int, device):
    import torch

    import fastfeed

    loader = fastfeed.Loader(packed, batch_size=batch, image_size=size, device=device, dtype=torch.uint8)
    print(f"fastfeed decoder={loader.settings.decoder} pipelines={loader.settings.pipelines}", flush=True)
    return loader


def paced_loader(packed: str, batch: int, size: int, device: str, per_s: float, ready) -> None:
    """resident+fastfeed-apart's other process: the loader's batches taken at `per_s` images/s, until killed."""
    import torch

    from fastfeed.detect.clients import to_ultralytics

    loader = fastfeed_loader(Path(packed), batch, size, torch.device(device))
    ready.set()
    due = time.perf_counter()
    while True:
        for b in loader:
            to_ultralytics(b)
            due += batch / per_s
            time.sleep(max(0.0, due - time.perf_counter()))


def batches(feed: str, yolo: Path, packed: Path, batch: int, size: int, device, loader=None):
    """An endless iterator of ultralytics-style batch dicts (img uint8, cls, bboxes, batch_idx) for `feed`
    (fastfeed: from `loader`)."""
    import torch

    if feed == "fastfeed":
        from fastfeed.detect.clients import to_ultralytics

        while True:
            for b in loader:
                yield to_ultralytics(b)
    if feed == "ultralytics":
        loader = ultralytics_loader(yolo, batch, size, len(os.sched_getaffinity(0)))
        while True:
            yield from loader
    # the resident batch: one batch, so no worker processes (killed mid-read, they printed ConnectionResetError)
    loader = ultralytics_loader(yolo, batch, size, 0)
    one = next(iter(loader))
    one = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in one.items()}
    del loader
    if feed == "resident+fastfeed":
        from fastfeed.detect.clients import to_ultralytics

        it = fastfeed_batches(packed, batch, size, device)
        while True:
            preprocess(to_ultralytics(next(it)), device)
            yield one
    while True:
        yield one


def fastfeed_batches(packed: Path, batch: int, size: int, device):
    loader = fastfeed_loader(packed, batch, size, device)
    while True:
        yield from loader


def preprocess(batch: dict, device) -> dict:
    """ultralytics' DetectionTrainer.preprocess (without multi-scale): to the device, img float / 255."""
    out = {k: v.to(device, non_blocking=True) if hasattr(v, "to") else v for k, v in batch.items()}
    out["img"] = out["img"].float() / 255
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--feed", choices=("resident", "ultralytics", "fastfeed", "resident+fastfeed",
                                      "resident+fastfeed-apart"), required=True)
    p.add_argument("--apart-rate", type=float, default=600.0,
                   help="resident+fastfeed-apart: images/s the other process takes (about the resident pace)")
    p.add_argument("--model", default="yolov8n.yaml")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=640)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--num-images", type=int, default=2000)
    p.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    p.add_argument("--variant", choices=VARIANTS, help="bench_detect.py's kind of data set (detection variants only)")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)

    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    device = torch.device(a.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    yolo, packed = (variant_data(a.workdir, a.num_images, a.variant) if a.variant
                    else prepare_data(a.workdir, a.num_images))
    model = DetectionModel(cfg=a.model, nc=4, verbose=False).to(device)
    model.args = get_cfg()  # the loss gains (box, cls, dfl), as the trainer sets them
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    loader = fastfeed_loader(packed, a.batch, a.size, device) if a.feed == "fastfeed" else None
    it = batches(a.feed, yolo, packed, a.batch, a.size, device, loader)
    apart = None
    if a.feed == "resident+fastfeed-apart":
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        ready = ctx.Event()
        apart = ctx.Process(target=paced_loader, args=(str(packed), a.batch, a.size, a.device, a.apart_rate, ready),
                            daemon=True)
        apart.start()
        if not ready.wait(300):
            raise RuntimeError("the other process's loader did not start in 300 s")

    def step():
        b = preprocess(next(it), device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, _ = model.loss(b)
        loss.sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return len(b["img"])

    for _ in range(a.warmup):
        step()
    sync()
    waited = loader.stats()["stages"]["wait"]["seconds"] if loader else None
    t0 = time.perf_counter()
    n = sum(step() for _ in range(a.steps))
    sync()
    wall = time.perf_counter() - t0
    if loader:  # the loop's wait for fastfeed's batches in the timed steps
        waited = round(loader.stats()["stages"]["wait"]["seconds"] - waited, 3)
    row = {"feed": a.feed, "model": a.model, "data": a.variant or "jpeg", "cores": len(os.sched_getaffinity(0)),
           "batch": a.batch,
           "size": a.size, "steps": a.steps, "images_per_s": n / wall, "wall_s": wall,
           "data_wait_s": waited,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(row), flush=True)
    if a.json:
        a.json.write_text(json.dumps(row, indent=1))
    if apart is not None:  # os._exit skips multiprocessing's clean-up of daemon children
        apart.kill()
        apart.join(10)
    os._exit(0)  # the loaders' worker processes and threads end with the process


if __name__ == "__main__":
    sys.exit(main())
