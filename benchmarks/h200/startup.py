"""Issue 14: where the time from `fastfeed.Loader(...)` to the first batch goes, phase by phase, in a fresh process.

    python3 benchmarks/h200/startup.py --data /tmp/ffbench/base-wds --decoder dali --json $OUT/startup-dali.json
    torchrun --standalone --nproc-per-node 2 benchmarks/h200/startup.py --data ... --decoder hybrid --json ...

One Loader per process (what a training job starts with: the first DALI pipeline of a process pays for loading
DALI's and nvJPEG's libraries and kernels). CUDA is initialised before the clock starts, as a training script has
done by the time it builds its loader. The phases are timed by wrapping the functions that run them (nothing in
fastfeed changes): opening the dataset, the sample table, each decoder and each DALI pipeline build, the ring, then
each decode worker's first batch (waiting for the ring, each DALI run). A Python thread that sleeps 1 ms at a time
records how long it could not get the GIL (its longest gap per phase): a phase that holds the GIL stalls the
training thread the same way. Under torchrun every rank writes its own record (--json gets a .rankN suffix).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

EVENTS: list[dict] = []
T0 = [0.0]


def now() -> float:
    return time.perf_counter() - T0[0]


def wrap(owner, name: str, label, first_only: bool = False):
    """Replace owner.name by a timed call; label(args, kwargs) names the event."""
    original = getattr(owner, name)
    seen = set()

    def timed(*args, **kwargs):
        tag = label(args, kwargs)
        if first_only and tag in seen:
            return original(*args, **kwargs)
        seen.add(tag)
        t = now()
        try:
            return original(*args, **kwargs)
        finally:
            EVENTS.append({"name": tag, "start": t, "end": now(), "thread": threading.current_thread().name})

    setattr(owner, name, timed)


class GilProbe(threading.Thread):
    """Sleeps 1 ms at a time; a longer gap is time another thread held the GIL (or the OS did not run us)."""

    def __init__(self):
        super().__init__(daemon=True, name="gil-probe")
        self.gaps: list[tuple[float, float]] = []  # (when it ended, gap s) for gaps over 5 ms
        self.stop = threading.Event()

    def run(self):
        last = now()
        while not self.stop.is_set():
            time.sleep(0.001)
            t = now()
            if t - last > 0.005:
                self.gaps.append((t, t - last))
            last = t


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--decoder", default="auto")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=4, help="batches taken after the first (their times too)")
    p.add_argument("--pipelines", type=int, default=None, help="given to the Loader (default: tuned)")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()  # without one (a smoke test on a CPU machine) the Loader runs on the CPU
    device = f"cuda:{local}" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.set_device(local)
        torch.ones(1, device="cuda").sum().item()  # the CUDA context exists, as in a training script

    import fastfeed
    import fastfeed.decode.dali as D
    import fastfeed.epoch as E
    import fastfeed.loader as L

    wrap(L, "open_dataset", lambda a, k: "open_dataset")
    wrap(L.Loader, "_sample_table", lambda a, k: "sample_table")
    wrap(L, "PrefetchRing", lambda a, k: "ring")
    counter = {"decoder": 0}

    def decoder_label(a, k):
        counter["decoder"] += 1
        return f"build_decoder[{counter['decoder'] - 1}]"

    wrap(L, "build_decoder", decoder_label)
    wrap(D.DaliDecoder, "_build", lambda a, k: "dali_build_" + ("cpu" if a[0]._device_id is None else "gpu"))
    wrap(D.DaliDecoder, "_run", lambda a, k: f"dali_first_run_{a[0].device.type}@{id(a[0]) % 10000}",
         first_only=True)
    wrap(E.EpochRun, "_take", lambda a, k: f"take[{threading.current_thread().name}]", first_only=True)
    wrap(E.EpochRun, "_produce", lambda a, k: f"produce[{a[1]}]")

    probe = GilProbe()
    sync()
    T0[0] = time.perf_counter()
    probe.start()
    loader = fastfeed.Loader(args.data, batch_size=args.batch_size, train=True, image_size=224,
                             device=device, dtype=torch.float16, channels_last=True, decoder=args.decoder,
                             pipelines=args.pipelines,
                             rank=int(os.environ.get("RANK", "0")), world_size=world, local_rank=local)
    t_built = now()
    it = iter(loader)
    next(it)
    sync()
    t_first = now()
    after = []
    for _ in range(args.batches):
        next(it)
        sync()
        after.append(now())
    probe.stop.set()
    probe.join()
    decoder = loader.settings.decoder
    loader.close()

    def longest_gap(a, b):
        return max((g for t, g in probe.gaps if a <= t - g / 2 <= b), default=0.0)

    phases = sorted(EVENTS, key=lambda e: e["start"])
    for e in phases:
        e["gil_gap_max_s"] = longest_gap(e["start"], e["end"])
    res = {"data": args.data, "decoder": args.decoder, "resolved": decoder, "rank": local, "world": world,
           "constructor_s": t_built, "first_batch_s": t_first, "next_batches_s": after, "events": phases,
           "gil_gaps_over_20ms": [(round(t, 3), round(g, 3)) for t, g in probe.gaps if g > 0.02],
           "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": torch.cuda.get_device_name(local) if cuda else None}
    print(f"[startup {args.decoder}->{decoder} pipelines={args.pipelines} rank {local}/{world}] "
          f"constructor {t_built:.2f} s, first batch "
          f"{t_first:.2f} s, then " + ", ".join(f"{t:.2f}" for t in after))
    for e in phases:
        print(f"    {e['start']:6.3f} .. {e['end']:6.3f}  {e['end'] - e['start']:6.3f} s  {e['name']:<34} "
              f"{e['thread']:<22} gil gap {e['gil_gap_max_s'] * 1e3:5.0f} ms")
    if args.json:
        path = args.json if world == 1 else f"{args.json}.rank{local}"
        Path(path).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
