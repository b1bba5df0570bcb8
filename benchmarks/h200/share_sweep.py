"""Issue 14: the hybrid decoder's response curve — the training loop's period at each fixed CPU share, step by step.

    python3 benchmarks/h200/share_sweep.py --data /tmp/ffbench/base-wds --consumers resnet50,resnet18 \
        --shares 0,0.125,0.25,0.375,0.5,0.625,0.75,0.875,1 --json $OUT/share-sweep.json

What the climber (fastfeed/decode/hybrid.py) has to find, measured directly: for every share, a fresh Loader with
decoder="hybrid" whose split is held at that share (the climber replaced by a fixed share), `--warmup` untimed steps,
then `--steps` timed ones. Each step's wall time is kept (not only the mean), so a climber can be replayed offline
against the measured noise. Rows run in the order given: give shares out of order, and one twice, so that a drift
over the run is not read as an effect of the share.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from fastfeed.bench.consumers import make_consumer, synthetic_batch  # noqa: E402
from fastfeed.bench.runner import percentiles, run_compute_only, run_loader  # noqa: E402


class FixedShare:
    """Stands in for the climber: the same share for every batch."""

    def __init__(self, share: float):
        self.share = share
        self.history: list = []

    def current(self) -> float:
        return self.share


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--consumers", default="resnet50,resnet18")
    p.add_argument("--shares", default="0,0.125,0.25,0.375,0.5,0.625,0.75,0.875,1")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import fastfeed
    import fastfeed.decode.hybrid as H

    shares = [float(x) for x in args.shares.split(",")]
    report = {"args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "gpu": torch.cuda.get_device_name(0), "consumers": {}}
    for cname in args.consumers.split(","):
        consumer = make_consumer(cname, "cuda")
        entry = report["consumers"][cname] = {"rows": []}
        if cname != "none":
            synth = synthetic_batch(args.batch_size, 224, "cuda", torch.float16)
            ceil = run_compute_only(consumer, synth, steps=60, warmup=10)
            entry["ceiling_step_s"] = percentiles(ceil)
            print(f"== {cname}: ceiling p50 {entry['ceiling_step_s']['p50'] * 1e3:.1f} ms", flush=True)
        for share in shares:
            fixed = FixedShare(share)
            original = H.climber_for  # make_decoder imports it from the module at each build
            H.climber_for = lambda pace, settle, start=0.0, _f=fixed: _f
            try:
                loader = fastfeed.Loader(args.data, batch_size=args.batch_size, train=True, image_size=224,
                                         device="cuda", dtype=torch.float16, channels_last=True, decoder="hybrid")
                res = run_loader(loader, consumer, name=f"share {share}", steps=args.steps, warmup=args.warmup,
                                 gpu_index=0, progress=False).to_dict()
                loader.close()
            finally:
                H.climber_for = original
            steps = res["per_step"]["step_s"]
            host = res["host"] or {}
            row = {"share": share, "samples_per_s": res["samples_per_s"], "step_s": res["step_s"],
                   "wait_fraction": res["wait_fraction"], "cores": host.get("cpu_cores_busy"),
                   "per_step_s": steps, "wait_s": res["per_step"]["wait_s"]}
            entry["rows"].append(row)
            print(f"{cname:9s} share {share:5.3f}: {row['samples_per_s']:8,.0f} img/s  mean step "
                  f"{sum(steps) / len(steps) * 1e3:6.1f} ms  p50 {res['step_s']['p50'] * 1e3:6.1f}  wait "
                  f"{row['wait_fraction']:5.1%}  cores {row['cores'] or float('nan'):5.1f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
