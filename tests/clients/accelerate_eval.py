"""Evaluation through Accelerate's `gather_for_metrics` with a detection or semantic fastfeed.Loader, launched by
tests/test_ddp_eval.py on 3 CPU processes:

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 3 tests/clients/accelerate_eval.py \
        --data D --task detect --batch-size 3 --out OUT

Each rank writes OUT/rank{r}.json: `len(loader)`, its batches' sample ids and `valid` masks, and the sample ids
`gather_for_metrics` returned over the pass (which trims the padding of the ranks' last step by itself).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from accelerate import Accelerator

import fastfeed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    loader = fastfeed.Loader(args.data, task=args.task, batch_size=args.batch_size, image_size=64, train=False,
                             device="cpu", num_threads=1, reader_threads=1)
    loader = accelerator.prepare(loader)
    record = {"rank": accelerator.process_index, "len": len(loader), "ids": [], "valid": [], "gathered": []}
    for batch in loader:
        record["ids"].append(batch["ids"].tolist())
        record["valid"].append(batch["valid"].tolist())
        record["gathered"] += accelerator.gather_for_metrics(batch["ids"]).tolist()
    (Path(args.out) / f"rank{accelerator.process_index}.json").write_text(json.dumps(record))
    loader.close()
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
