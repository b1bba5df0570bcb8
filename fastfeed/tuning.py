"""`num_threads="auto"`: pick the DALI decode settings for this machine by a short measurement at start-up.

On the H200 the settings matter more than anything else in the pipeline: DALI's default hardware-decoder share
and thread count lose up to half the throughput, and the best values move with the CPU count, the image mix and
the model sharing the GPU. So rather than guess, the loader decodes a few real batches of the dataset under each
candidate setting (bounded: about a second each) and keeps the fastest. The candidates are the ones that won
somewhere in benchmarks/RESULTS.md; the full table of what was tried is reported in `loader.stats()["info"]`.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

__all__ = ["DecodeSettings", "CANDIDATES", "candidates", "tune_decoders"]


@dataclass(frozen=True)
class DecodeSettings:
    hw_decoder_load: float
    num_threads: int
    pipelines: int


# Measured winners on an H200 (benchmarks/RESULTS.md): the hardware decoder taking everything with few CPU
# threads, or 90% of it with more threads; two or three pipelines side by side.
CANDIDATES = (
    DecodeSettings(1.0, 2, 2),
    DecodeSettings(1.0, 2, 3),
    DecodeSettings(0.9, 4, 2),
    DecodeSettings(0.9, 4, 3),
)


def candidates(settings) -> list[DecodeSettings]:
    """The candidates worth measuring for a Loader's settings: those that keep what the user fixed."""
    keep = [c for c in CANDIDATES
            if ("hw_decoder_load" not in settings.fixed or c.hw_decoder_load == settings.hw_decoder_load)
            and ("pipelines" not in settings.fixed or c.pipelines == settings.pipelines)]
    return keep or [DecodeSettings(settings.hw_decoder_load, settings.decode_threads, settings.pipelines)]


def _throughput(decoders, batches) -> float:
    """Images/s of `decoders` working side by side over `batches` (list of (samples, windows)), one thread each."""
    todo = list(range(len(batches)))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(dec):
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            try:
                dec(*batches[i])
            except BaseException as e:  # noqa: BLE001 - reported below: a failing setting is not chosen
                errors.append(e)
                return

    for dec in decoders:  # warm-up: first runs allocate and initialise the decoders
        dec(*batches[0])
    _sync()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(d,)) for d in decoders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _sync()
    if errors:
        raise errors[0]
    return sum(len(b[0]) for b in batches) / (time.perf_counter() - t0)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def tune_decoders(make_decoder, batches, candidates=CANDIDATES, cpu_count: int | None = None):
    """Measure each candidate on `batches` and return (best settings, its decoders, table of results).

    `make_decoder(hw_decoder_load, num_threads)` builds one decoder. Decoders of losing candidates are closed.
    Candidates needing more CPU threads than the machine has are skipped.
    """
    table, best = [], None
    for c in candidates:
        if cpu_count is not None and c.num_threads * c.pipelines > max(2, cpu_count):
            continue
        decoders = []
        try:
            decoders = [make_decoder(c.hw_decoder_load, c.num_threads) for _ in range(c.pipelines)]
            rate = _throughput(decoders, batches)
        except Exception as e:  # noqa: BLE001 - a setting DALI refuses here is simply not chosen
            table.append({**c.__dict__, "images_per_s": None, "error": f"{type(e).__name__}: {e}"[:200]})
            for d in decoders:
                d.close()
            continue
        table.append({**c.__dict__, "images_per_s": round(rate, 1)})
        if best is None or rate > best[1]:
            if best is not None:
                for d in best[2]:
                    d.close()
            best = (c, rate, decoders)
        else:
            for d in decoders:
                d.close()
    if best is None:
        raise RuntimeError(f"no decode setting worked on this machine: {table}")
    return best[0], best[2], table


def sample_batches(dataset, widths, heights, batch_size: int, count: int, seed: int, train: bool, image_size: int):
    """`count` batches of real samples (read plainly: this runs once) with their crop windows."""
    from fastfeed.decode import crop_windows

    n = len(dataset)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = rng.choice(n, size=min(batch_size, n), replace=n < batch_size)
        samples = [np.frombuffer(dataset.read(int(i)), dtype=np.uint8) for i in ids]
        windows = crop_windows(widths[ids], heights[ids], ids, seed=seed, epoch=0, train=train,
                               image_size=image_size)
        out.append((samples, windows))
    return out
