"""The side-by-side table: images/s *inside the training step*, fastfeed against tuned DALI and the DataLoader.

    python3 benchmarks/gpu/train_table.py --data /tmp/ffbench/base-wds --images /tmp/ffbench/base-images \
        --consumers none,resnet50,resnet18 --rows default,dali,torch --json $OUT/table.json

(benchmarks/gpu/run.sh runs it with the arguments of each table: benchmarks/README.md.) For every consumer the
ceiling comes first (the model's step on a batch already on the GPU), then the rows, one after the other in this
process. Every row builds its loader fresh, takes the first batch (time to the first batch, from the constructor
call to the first batch on the GPU), then runs `--warmup` untimed steps (more, up to `--max-warmup`, while a
fastfeed Loader is still tuning itself) and `--steps` timed steps with fastfeed.bench.runner; each step ends with a
device synchronise, so the loader's GPU work is paid inside the step that consumes it.
All loaders: train mode (RandomResizedCrop + flip + normalise), float16 output, batch 256 (default), on cuda:0.
Rows, in this order:
  ff-default       fastfeed.Loader with its defaults (channels_last=True)
  ff-default chroma=M   the same under FASTFEED_DALI_CHROMA=M (how JPEG chroma is upsampled, decode/dali.py)
  NAME             --extra-ff "NAME=dict(kwargs);...": fastfeed.Loader(**kwargs), e.g. gpu=dict(decoder="dali");
                   "ff-default=dict()" puts the defaults' row in that place instead
  ff pP hwH tT     --rows ff: fastfeed.Loader(pipelines=P, hw_decoder_load=H, num_threads=T) over --ff-grid
  dali-file/-wds   DALI's readers + fused image_random_crop(mixed), over --dali-grid (hw_decoder_load:threads)
                   (--rows dali: both readers; dali-file or dali-wds: that one) (dali_reference.py)
  torch-dl         DataLoader + ImageFolder + PIL + torchvision v2, 16 workers, pin_memory
--per-step keeps every timed step's time and wait and what the loader did inside it (Timeline).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # dali_reference
sys.path.insert(0, str(HERE.parent.parent))  # this tree's fastfeed

from fastfeed.bench.consumers import make_consumer, synthetic_batch  # noqa: E402
from fastfeed.bench.runner import percentiles, run_compute_only, run_loader  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Started:
    """Wraps a loader whose first batch was already taken (to time it) so the runner continues the same
    iteration instead of starting a new epoch."""

    def __init__(self, loader, it, first):
        self.loader, self._it, self._first = loader, it, first

    def __iter__(self):
        if self._first is not None:
            first, self._first = self._first, None
            yield first
            yield from self._it
        else:
            yield from self.loader

    def stats(self):
        return self.loader.stats() if hasattr(self.loader, "stats") else None


def measure(name, factory, consumer, args, extra=None):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    try:
        loader = factory()
        t_built = time.perf_counter() - t0
        it = iter(loader)
        first = next(it)
        torch.cuda.synchronize()
        ttfb = time.perf_counter() - t0
    except Exception as e:  # a configuration that cannot be built is a result too
        log(f"{name}: could not start: {type(e).__name__}: {str(e)[:300]}")
        return None
    timeline = Timeline(consumer) if args.per_step else None
    epoch_batches = len(loader) if timeline is not None and hasattr(loader, "__len__") else None  # before close()
    try:
        with timeline or _null():
            res = run_loader(Started(loader, it, first), timeline or consumer, name=name, steps=args.steps,
                             warmup=args.warmup, max_warmup=args.max_warmup or None, gpu_index=0, progress=False)
    except Exception as e:
        log(f"{name}: failed: {type(e).__name__}: {str(e)[:300]}")
        return None
    finally:
        if hasattr(loader, "close"):
            loader.close()
    d = res.to_dict()
    d["warmup_steps"] = res.warmup_steps  # more than --warmup when --max-warmup waited for the tuning to settle
    per_step = d.pop("per_step", None)
    if timeline is not None:
        d["per_step"] = timeline.summary(per_step, batches_before=1 + res.warmup_steps, epoch_batches=epoch_batches)
    d["build_s"], d["first_batch_s"] = t_built, ttfb
    if hasattr(loader, "stats") and callable(loader.stats):
        try:
            snap = loader.stats()
            info = snap.get("info", {})
            d["info"] = {k: v for k, v in info.items() if k != "autotune"}
            c = snap.get("counters", {})
            if c.get("cpu_decoded") is not None:  # decoder="hybrid": the share of images the CPU decoded
                d["cpu_share"] = c["cpu_decoded"] / max(1, c["cpu_decoded"] + c["gpu_decoded"])
                climber = _climber(loader)  # the share it settled on, and how
                if climber is not None:
                    d["final_cpu_share"], d["climber_history"] = climber.share, climber.history
            if "pipeline_history" in snap:  # the pipeline tuner (fastfeed/tuning/pipelines.py): where it ended
                d["pipelines_now"], d["pipeline_history"] = info.get("pipelines"), snap["pipeline_history"]
                if info.get("gpu_pipelines") is not None:  # "cpu-dali": how many of them decode on the GPU
                    d["gpu_pipelines_now"] = info["gpu_pipelines"]
        except Exception:  # noqa: BLE001 - DaliReference etc.
            pass
    # a pipeline built inside the timed steps costs its first decodes a few slow steps: the row may read low
    built = ((res.loader_stats or {}).get("counters") or {}).get("pipelines_built", 0)
    if built:
        d["pipelines_built_timed"] = built
    d.update(extra or {})
    slow = (d.get("per_step") or {}).get("slow")
    if slow:  # what the steps over the 90th percentile had that the others had not (Timeline.summary)
        log(f"{name:34s} steps >= {slow['cut_ms']:.1f} ms against the rest: " + "; ".join(
            f"{k} " + ", ".join(f"{f} {slow[k][f]}" for f in ("steps", "step_ms", "wait_ms", "decode_per_step_ms",
                                                             "epoch_first", "gc", "build", "cpu_share"))
            for k in ("slow", "rest")))
    host = d["host"] or {}
    log(f"{name:34s} {d['samples_per_s']:9,.0f} img/s  step p50 {d['step_s']['p50'] * 1e3:6.1f} ms  "
        f"wait {d['wait_fraction']:6.1%}  cores {host.get('cpu_cores_busy', float('nan')):5.1f}  "
        f"first batch {ttfb:5.2f} s" + (f"  cpu share {d['cpu_share']:.0%}" if "cpu_share" in d else "")
        + (f" (last {d['final_cpu_share']:.0%})" if "final_cpu_share" in d else "")
        + (f"  pipelines {d['pipelines_now']}" if "pipelines_now" in d else "")
        + (f" ({d['gpu_pipelines_now']} on the GPU)" if d.get("gpu_pipelines_now") else "")
        + (f" (+{d['pipelines_built_timed']} built in the timed steps)" if "pipelines_built_timed" in d else "")
        + (f"  warm-up {d['warmup_steps']}" if d["warmup_steps"] > args.warmup else ""))
    return d


def _climber(loader):
    """The hybrid's ShareClimber of a fastfeed Loader (owned by the Loader, or by its first decoder), or None."""
    for owner in (loader, *(getattr(loader, "_decoders", None) or [])[:1]):
        for name in ("_climber", "climber"):
            c = getattr(owner, name, None)
            if c is not None and hasattr(c, "history"):
                return c
    return None


class Timeline:
    """--per-step: wraps the consumer to note when each step's compute began, and records meanwhile the interpreter's
    garbage collections (gc.callbacks) and, for a fastfeed row, the loader's own events: each batch's decode (worker
    thread, start, end: `EpochRun._produce`), each pipeline build (`ConsumerPace.building`), each change of the
    pipeline count (`PipelineTuner._set`) and of the hybrid's CPU share (`ShareClimber._set`). So a slow step can be
    told apart: an epoch boundary, a collection (the GIL held for its whole length), a build or a tuner's try, more
    decode work than usual beside it, or none of these. The wrappers are installed on the classes for the row only;
    a method the library no longer has is left out (said once), the rest is still recorded."""

    def __init__(self, consumer):
        self._consumer = consumer
        self.calls: list[float] = []  # perf_counter at each consumer call (warm-up included)
        self.gc: list[tuple[float, float, int]] = []  # (start, seconds, generation)
        self._gc_start = None
        self.decodes: list[tuple[str, float, float]] = []  # (thread, start, end) of each batch's decode
        self.builds: list[tuple[float, float]] = []  # (start, end) of each pipeline build
        self.changes: list[tuple[float, str, float]] = []  # (time, "pipelines" or "cpu_share", new value)
        self._undo: list = []

    def __call__(self, images, labels):
        self.calls.append(time.perf_counter())
        return self._consumer(images, labels)

    def _on_gc(self, phase, info):
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self.gc.append((self._gc_start, time.perf_counter() - self._gc_start, info["generation"]))
            self._gc_start = None

    def _wrap(self, cls, name, make):
        old = getattr(cls, name, None)
        if old is None:
            log(f"--per-step: {cls.__name__}.{name} not found, its events are not recorded")
            return
        setattr(cls, name, make(old))
        self._undo.append((cls, name, old))

    def __enter__(self):
        import contextlib
        import gc
        import threading

        from fastfeed.loader.epoch import EpochRun
        from fastfeed.tuning.climber import ShareClimber
        from fastfeed.tuning.pace import ConsumerPace
        from fastfeed.tuning.pipelines import PipelineTuner

        gc.callbacks.append(self._on_gc)
        clock = time.perf_counter

        def produce(old):
            def timed(run, *args, **kwargs):
                t0 = clock()
                try:
                    return old(run, *args, **kwargs)
                finally:
                    self.decodes.append((threading.current_thread().name, t0, clock()))
            return timed

        def building(old):
            @contextlib.contextmanager
            def timed(pace):
                t0 = clock()
                try:
                    with old(pace):
                        yield
                finally:
                    self.builds.append((t0, clock()))
            return timed

        def noted(kind):
            def make(old):
                def changed(obj, value, *args, **kwargs):
                    self.changes.append((clock(), kind, float(value)))
                    return old(obj, value, *args, **kwargs)
                return changed
            return make

        self._wrap(EpochRun, "_produce", produce)
        self._wrap(ConsumerPace, "building", building)
        self._wrap(PipelineTuner, "_set", noted("pipelines"))
        self._wrap(ShareClimber, "_set", noted("cpu_share"))
        return self

    def __exit__(self, *exc):
        import gc

        gc.callbacks.remove(self._on_gc)
        for cls, name, old in reversed(self._undo):
            setattr(cls, name, old)
        self._undo.clear()
        return False

    def summary(self, per_step: dict, *, batches_before: int, epoch_batches: int | None) -> dict:
        """Per timed step (ms unless said): its time, its wait, the collections' time inside it, whether it took the
        first batch of an epoch (batch numbers count from the loader's first batch; `epoch_batches` = len(loader)),
        the decode time of all workers inside it (decode_ms: two workers busy throughout = 2 x the step) and the
        decodes that began in it, whether a build overlapped it, and the pipeline count and CPU share last set before
        it began (None: never changed since the row started). `slow` compares the steps over the 90th percentile
        with the rest (`slow_steps`)."""
        steps, waits = per_step["step_s"], per_step["wait_s"]
        calls = self.calls[-len(steps):]
        starts = [c - w for c, w in zip(calls, waits)]
        gc_ms, gen2, decode_ms, began, built, pipelines, share = [], [], [], [], [], [], []
        for i, t0 in enumerate(starts):
            t1 = t0 + steps[i]
            inside = [(d, g) for s, d, g in self.gc if t0 <= s < t1]
            gc_ms.append(round(1e3 * sum(d for d, _ in inside), 3))
            gen2.append(any(g == 2 for _, g in inside))
            decode_ms.append(round(1e3 * sum(max(0.0, min(b, t1) - max(a, t0)) for _, a, b in self.decodes), 3))
            began.append(sum(t0 <= a < t1 for _, a, _ in self.decodes))
            built.append(any(a < t1 and b > t0 for a, b in self.builds))
            pipelines.append(_last_before(self.changes, "pipelines", t0))
            share.append(_last_before(self.changes, "cpu_share", t0))
        first = [bool(epoch_batches) and (batches_before + i) % epoch_batches == 0 for i in range(len(steps))]
        out = {"step_ms": [round(1e3 * x, 3) for x in steps], "wait_ms": [round(1e3 * x, 3) for x in waits],
               "gc_ms": gc_ms, "gc_gen2": gen2, "epoch_first_batch": first, "decode_ms": decode_ms,
               "decodes_begun": began, "build": built, "pipelines": pipelines, "cpu_share": share}
        out["slow"] = slow_steps(out)
        return out


def _last_before(changes, kind: str, t: float):
    values = [v for at, k, v in changes if k == kind and at < t]
    return values[-1] if values else None


def slow_steps(per_step: dict) -> dict:
    """The timed steps over the 90th percentile against the rest: how many, their mean step and wait, and how many
    of each took an epoch's first batch, held a collection, overlapped a build, ran beside a CPU share (> 0); and the
    mean decode time beside each (ms of all workers' decode inside the step, per ms of step)."""
    steps = per_step["step_ms"]
    if len(steps) < 10:
        return {}
    cut = sorted(steps)[int(0.9 * len(steps))]
    groups = {"slow": [i for i, x in enumerate(steps) if x >= cut], "rest": [i for i, x in enumerate(steps) if x < cut]}
    out = {"cut_ms": cut}
    for name, idx in groups.items():
        n = max(1, len(idx))
        out[name] = {
            "steps": len(idx),
            "step_ms": round(sum(steps[i] for i in idx) / n, 2),
            "wait_ms": round(sum(per_step["wait_ms"][i] for i in idx) / n, 2),
            "epoch_first": sum(per_step["epoch_first_batch"][i] for i in idx),
            "gc": sum(per_step["gc_ms"][i] > 0 for i in idx),
            "build": sum(per_step["build"][i] for i in idx),
            "cpu_share": sum((per_step["cpu_share"][i] or 0) > 0 for i in idx),
            "decode_per_step_ms": round(sum(per_step["decode_ms"][i] / max(1e-9, steps[i]) for i in idx) / n, 3),
        }
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="fastfeed wds dataset")
    p.add_argument("--images", required=True, help="the same images as an ImageFolder tree")
    p.add_argument("--label", default="imagenet")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--max-warmup", type=int, default=0,
                   help="warm up beyond --warmup while a Loader is still tuning itself (stats info tuning_settled), "
                        "up to this many steps; 0: --warmup exactly")
    p.add_argument("--consumers", default="none,resnet50,resnet18")
    p.add_argument("--ff-grid", default="1:1.0:2,1:0.9:4,2:1.0:2,2:0.9:4,3:1.0:2,3:0.9:4,1:1.0:4,2:1.0:4",
                   help="pipelines:hw_decoder_load:threads rows of fastfeed (--rows ff)")
    p.add_argument("--dali-grid", default="0.9:4,1.0:2,0.9:6,1.0:4")
    p.add_argument("--rows", default="default,dali,torch",
                   help="comma list of: default, ff, dali (both readers), dali-file, dali-wds, torch; none: no row "
                        "but --extra-ff's and --chroma's")
    p.add_argument("--extra-ff", default="", help="name=python-kwargs;... extra fastfeed rows, e.g. new=dict()")
    p.add_argument("--chroma", default="",
                   help="comma list of FASTFEED_DALI_CHROMA modes (roi,full,plain): ff-default once under each")
    p.add_argument("--torch-workers", type=int, default=16)
    p.add_argument("--per-step", action="store_true",
                   help="keep every timed step's time and wait, the garbage collections inside it, epoch starts")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rows_wanted = set(args.rows.split(","))

    import fastfeed

    S, bs = args.image_size, args.batch_size

    def ff(**kw):
        """A fastfeed row: Loader(**kw) on the dataset, channels_last unless given."""
        kw.setdefault("channels_last", True)
        return lambda: fastfeed.Loader(args.data, batch_size=bs, train=True, image_size=S, device="cuda",
                                       dtype=torch.float16, **kw)

    def dali(source, root, hw, t):
        from dali_reference import DaliReference
        return lambda: DaliReference(source, str(root), batch_size=bs, num_threads=t, device_id=0,
                                     hw_decoder_load=hw, image_size=S)

    def torch_dl():
        from fastfeed.bench.torch_baseline import make_torch_loader
        return lambda: make_torch_loader(args.images, batch_size=bs, image_size=S, device="cuda",
                                         dtype=torch.float16, num_workers=args.torch_workers)

    env = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": torch.cuda.get_device_name(0),
           "cpu_count": os.cpu_count(), "torch": torch.__version__, "fastfeed": fastfeed.__file__}
    try:
        import nvidia.dali as d
        env["dali"] = d.__version__
    except ImportError:
        env["dali"] = None
    log(f"env {env}")
    report = {"env": env, "args": vars(args), "consumers": {}}
    for cname in args.consumers.split(","):
        consumer = make_consumer(cname, "cuda")
        entry = {"rows": {}}
        if cname != "none":
            synth = synthetic_batch(bs, S, "cuda", torch.float16)
            ceil = percentiles(run_compute_only(consumer, synth, steps=args.steps, warmup=args.warmup))
            entry["ceiling_step_s"], entry["ceiling_img_s"] = ceil, bs / ceil["p50"]
            log(f"== {cname} ({args.label}, {S}px): ceiling {ceil['p50'] * 1e3:.1f} ms = {bs / ceil['p50']:,.0f} img/s")
        else:
            log(f"== loader alone ({args.label}, {S}px)")
        rows = entry["rows"]

        def add(name, fac, **kw):
            r = measure(f"{cname} <- {name}", fac, consumer, args, **kw)
            if r is not None:
                if "ceiling_step_s" in entry:
                    r["slowdown_vs_ceiling"] = r["step_s"]["p50"] / entry["ceiling_step_s"]["p50"] - 1
                rows[name] = r
            return r

        if "default" in rows_wanted:
            add("ff-default", ff())
        for mode in filter(None, args.chroma.split(",")):
            os.environ["FASTFEED_DALI_CHROMA"] = mode
            try:
                add(f"ff-default chroma={mode}", ff())
            finally:
                del os.environ["FASTFEED_DALI_CHROMA"]
        for spec in filter(None, args.extra_ff.split(";")):
            name, _, kw = spec.partition("=")
            add(name, ff(**eval(kw)))  # noqa: S307 - benchmark CLI, the operator's own expression
        if "ff" in rows_wanted:
            for g in args.ff_grid.split(","):
                pp, hw, t = g.split(":")
                add(f"ff p{pp} hw{hw} t{t}", ff(pipelines=int(pp), hw_decoder_load=float(hw), num_threads=int(t)))
        for label, source, root in (("dali-file", "file", args.images), ("dali-wds", "webdataset", args.data)):
            if "dali" in rows_wanted or label in rows_wanted:  # "dali": both readers
                for g in args.dali_grid.split(","):
                    hw, t = g.split(":")
                    add(f"{label} hw{hw} t{t}", dali(source, root, float(hw), int(t)))
        if "torch" in rows_wanted:
            add("torch-dl", torch_dl())
        report["consumers"][cname] = entry
        del consumer
        torch.cuda.empty_cache()
        if args.json:  # after every consumer: a later failure keeps what was measured
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    print_table(report)
    return 0


def print_table(report):
    for cname, e in report["consumers"].items():
        ceil = e.get("ceiling_img_s")
        print(f"\n=== {report['args']['label']} / {cname}" + (f": ceiling {ceil:,.0f} img/s" if ceil else "") + " ===")
        print(f"{'row':40s} {'img/s':>8s} {'step ms':>8s} {'wait':>6s} {'slower':>7s} {'cores':>5s} {'1st s':>5s}")
        for name, r in e["rows"].items():
            sl = r.get("slowdown_vs_ceiling")
            print(f"{name:40s} {r['samples_per_s']:8,.0f} {r['step_s']['p50'] * 1e3:8.1f} {r['wait_fraction']:6.1%} "
                  f"{'' if sl is None else f'{sl:7.1%}':>7s} {(r['host'] or {}).get('cpu_cores_busy', 0):5.1f} "
                  f"{r['first_batch_s']:5.2f}")


if __name__ == "__main__":
    sys.exit(main())
