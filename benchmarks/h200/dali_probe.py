"""Issue 14, eighteenth session: two facts about DALI 2.4's pipelines that the dev box showed on its CPU backend,
checked on the GPU.

    python3 benchmarks/h200/dali_probe.py --images /tmp/ffbench/base-images --json $OUT/dali-probe.json
    python3 benchmarks/h200/dali_probe.py --images DIR --cpu       # DALI's CPU backend only (a smoke test)

1. builds: a DaliDecoder's pipeline built while no other pipeline of the process is alive ("alone": the first, or
   after every one was closed) against one built beside a live one ("beside"), ROUNDS times each, GPU then CPU. On an
   H200 (ad hoc, this session) the first GPU build of a process took ~1.7 s, one beside a live pipeline 0.25 s, and one
   after all were closed ~1.7 s again.
2. damage: a batch of --batch-size JPEGs from --images, its first record damaged one way, decoded by a DaliDecoder
   directly (not through a Loader, which holds back unchecked JPEGs with a broken header: `_untrusted`, then in
   epoch.py, now assemble.py), on_error="skip", twice; each kind in a child process, so that a crash is a result: its
   exit code and the records reported. Kinds: garbage (the first 200 bytes kept, the rest 0x07: the DALI 2.4 CPU decoder
   segfaulted on it in 4-6 runs of 6 at batch 64), trunc (the first half), flip (40 bytes of the scan XORed), zeros
   (2,000 bytes of the scan zeroed).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastfeed.decode.crop import crop_windows  # noqa: E402
from fastfeed.decode.dali import DaliDecoder  # noqa: E402

KINDS = ("garbage", "trunc", "flip", "zeros")


def builds(device_id, rounds: int) -> dict:
    def build():
        t0 = time.perf_counter()
        d = DaliDecoder(device_id=device_id, image_size=224, dtype=torch.float16, batch_size=256, num_threads=2)
        return d, (time.perf_counter() - t0) * 1e3

    first, ms = build()
    res = {"first_of_process_ms": ms, "alone_ms": [], "beside_ms": []}
    second, ms = build()
    res["beside_ms"].append(ms)
    first.close()
    second.close()
    for _ in range(rounds):
        a, ms_a = build()
        b, ms_b = build()
        res["alone_ms"].append(ms_a)
        res["beside_ms"].append(ms_b)
        a.close()
        b.close()
    return res


def damaged(sample: np.ndarray, kind: str) -> np.ndarray:
    s = sample.copy()
    if kind == "garbage":
        return np.concatenate([s[:200], np.full(max(len(s) - 200, 1000), 7, np.uint8)])
    if kind == "trunc":
        return s[: len(s) // 2]
    if kind == "flip":
        at = np.random.default_rng(0).integers(len(s) // 3, len(s) - 10, 40)
        s[at] ^= 0x5A
        return s
    s[len(s) // 3: len(s) // 3 + 2000] = 0
    return s


def damage_child(images: str, n: int, kind: str, gpu: bool) -> None:
    """Runs in the child: decode the damaged batch twice, print what was reported."""
    from PIL import Image

    files = sorted(p for p in Path(images).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))[:n]
    samples = [np.fromfile(p, dtype=np.uint8) for p in files]
    sizes = [Image.open(p).size for p in files]
    windows = crop_windows([w for w, _ in sizes], [h for _, h in sizes], np.arange(len(files)), seed=0, epoch=0,
                           train=True, image_size=224)
    dec = DaliDecoder(device_id=0 if gpu else None, image_size=224, dtype=torch.float16, batch_size=len(files),
                      num_threads=2, on_error="skip")
    dec(samples, windows)
    batch = [damaged(samples[0], kind)] + samples[1:]
    for _ in range(2):
        out = dec(batch, windows)
        print(json.dumps([[r[0], r[1], r[2][:120]] for r in out.replaced]), flush=True)
    dec.close()


def damage(images: str, n: int, gpu: bool) -> dict:
    res = {}
    for kind in KINDS:
        run = subprocess.run([sys.executable, __file__, "--images", images, "--batch-size", str(n), "--child", kind]
                             + ([] if gpu else ["--cpu"]), capture_output=True, text=True, timeout=300)
        lines = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("[")]
        res[kind] = {"returncode": run.returncode, "replaced": lines}
        print(f"[damage {kind}, {'GPU' if gpu else 'CPU'} decoder, batch {n}] exit {run.returncode}, reported "
              f"{lines}", flush=True)
    return res


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--images", required=True, help="a folder of JPEGs (ImageFolder or flat)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cpu", action="store_true", help="DALI's CPU backend only (no GPU needed)")
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    gpu = not args.cpu
    if args.child:
        damage_child(args.images, args.batch_size, args.child, gpu)
        return 0
    if gpu:
        torch.ones(1, device="cuda").sum().item()  # the CUDA context exists, as in a training script
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": torch.cuda.get_device_name(0) if gpu else None}
    for name, device_id in ([("gpu", 0)] if gpu else []) + [("cpu", None)]:
        res[f"builds_{name}"] = b = builds(device_id, args.rounds)
        print(f"[builds {name}] first of the process {b['first_of_process_ms']:.0f} ms; alone "
              + ", ".join(f"{x:.0f}" for x in b["alone_ms"]) + " ms; beside a live one "
              + ", ".join(f"{x:.0f}" for x in b["beside_ms"]) + " ms", flush=True)
    res["damage"] = damage(args.images, args.batch_size, gpu)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
