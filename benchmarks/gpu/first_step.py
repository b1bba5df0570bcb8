"""From `Loader(...)` to the end of the first training step, in a script shaped like a real one: the Loader, then the
model and its optimizer, then the loop's first batch and step. Each row is a fresh process.

    python3 benchmarks/gpu/first_step.py DATASET --device cuda --model resnet50 --batch 256 --rounds 2
    python3 benchmarks/gpu/first_step.py DATASET [--device cpu] [--model resnet18] [--batch 64]     # a CPU box

Timed from the constructor call: the constructor, the model's build (torchvision, on the device, channels_last on a
GPU, SGD), the first batch in hand, and the first step (forward, backward, optimizer step; synchronised). The Loader
runs with its defaults: a training Loader reads epoch 0 while its decoders are built, and with decoders on the GPU
decodes its first batches while the script builds its model (docs/design/epochs.md). Prints each row and the
medians; --json writes them.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this tree's fastfeed

KEYS = ("constructor_s", "model_s", "first_batch_s", "first_step_s")


def child(a) -> dict:
    import torch
    import torchvision

    import fastfeed

    cuda = a.device.startswith("cuda")
    dtype = torch.float16 if cuda else torch.float32

    def sync():
        if cuda:
            torch.cuda.synchronize()

    if cuda:
        torch.cuda.init()
    sync()
    t0 = time.perf_counter()
    loader = fastfeed.Loader(a.dataset, batch_size=a.batch, train=True, image_size=a.size, device=a.device,
                             dtype=dtype, channels_last=cuda)
    built = time.perf_counter() - t0
    model = getattr(torchvision.models, a.model)(num_classes=1000).to(a.device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sync()
    setup = time.perf_counter() - t0 - built
    images, labels = next(iter(loader))
    sync()
    first = time.perf_counter() - t0
    with torch.autocast(a.device.split(":")[0], dtype=torch.bfloat16, enabled=cuda):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    sync()
    step = time.perf_counter() - t0
    loader.close()
    return {"constructor_s": built, "model_s": setup, "first_batch_s": first, "first_step_s": step}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset")
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default="resnet18", help="a torchvision.models constructor")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=2, help="rounds of two fresh processes")
    p.add_argument("--json", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a)))
        return 0
    rows = []
    for _ in range(2 * a.rounds):
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--child"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            return 1
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(r)
        print(f"constructor {r['constructor_s']:.2f} s, model {r['model_s']:.2f} s, first batch "
              f"{r['first_batch_s']:.2f} s, first step done {r['first_step_s']:.2f} s", flush=True)
    medians = {k: statistics.median(r[k] for r in rows) for k in KEYS}
    print(f"median: first batch {medians['first_batch_s']:.2f} s, first step done {medians['first_step_s']:.2f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": {k: v for k, v in vars(a).items() if k != "child"},
                                            "rows": rows, "medians": medians,
                                            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
