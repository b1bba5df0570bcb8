"""The GPU detection loader alone under several Loader settings, side by side in one process, A B ... A: which of
the hardware decoder's share, DALI's threads and the pipeline count limits the batch rate.

    python3 benchmarks/gpu/detect_sweep.py PACKED [--seconds 12] [--configs JSON-LIST]

PACKED: bench_detect.py's packed set (its `prepare_data`); each config is Loader keywords on top of bench_detect's
fastfeed loader (batch 64, 640 px, float16 on the GPU, ultralytics' default training augmentation).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_detect import fastfeed_loader, measure, to_device_fastfeed  # noqa: E402

# The next question (benchmarks/README.md, "Detection batches"): is the ~7,000 img/s ceiling the hardware decoder's?
# If so, a share for the CUDA decoder with enough CPU threads for its Huffman stage lifts it.
DEFAULT = [{"pipelines": 4}, {"pipelines": 4, "hw_decoder_load": 0.75, "num_threads": 3},
           {"pipelines": 4, "hw_decoder_load": 0.6, "num_threads": 3},
           {"pipelines": 2, "hw_decoder_load": 0.6, "num_threads": 7}, {"pipelines": 4}]


def rate(packed: Path, extra: dict, seconds: float) -> float:
    """bench_detect's fastfeed side with `extra`: 8 batches of warm-up, then img/s over `seconds`, each batch
    waited for on the GPU (its `to_device_fastfeed`)."""
    loader = fastfeed_loader(packed, 64, 640, "cuda", extra)
    r = measure(loader, lambda b: to_device_fastfeed(b, "cuda"), 8, seconds)["images_per_s"]
    loader.close()
    return r


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("packed", type=Path)
    p.add_argument("--seconds", type=float, default=12)
    p.add_argument("--configs", type=json.loads, default=DEFAULT)
    a = p.parse_args()
    for extra in a.configs:
        print(f"{json.dumps(extra):70s} {rate(a.packed, extra, a.seconds):8.0f} img/s", flush=True)


if __name__ == "__main__":
    main()
