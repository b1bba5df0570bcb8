"""What training scripts and frameworks read from a DataLoader, provided for `fastfeed.Loader`.

- `EpochSampler`: `loader.sampler`, the object scripts call `set_epoch()` on (torchvision's reference script, timm,
  Lightning's `_set_sampler_epoch`) and take `len()` of.
- `AccelerateState`: the dataloader-state protocol of Hugging Face Accelerate (`end_of_dataloader`, `remainder`),
  so `accelerator.gather_for_metrics` trims the padding that evens out ranks and gradient accumulation syncs at the
  end of the epoch, with no change to the user's script.
- `seeded_call`: runs a per-batch transform (MixUp/CutMix) with the global RNGs seeded from (seed, epoch, batch), so
  it is deterministic and a resumed run applies exactly the same mixing.
"""
from __future__ import annotations

import random
import sys
import weakref

import numpy as np
import torch

__all__ = ["EpochSampler", "AccelerateState", "seeded_call"]


class EpochSampler:
    """`loader.sampler`: a read-only view of the Loader's epoch plan, shaped like `DistributedSampler`.

    `set_epoch(e)` is `loader.set_epoch(e)`; `len()` is the number of samples this rank reads per epoch (padding
    included, as DistributedSampler counts); iterating yields this rank's sample ids of the current epoch in order.
    """

    def __init__(self, loader):
        # A weak reference: a Loader then has no reference cycle through its sampler and is freed (and closed) by
        # reference counting where its last reference goes, not later by the cycle collector in whatever thread
        # that happens to run (fastfeed/loader/loader.py, Loader.__del__).
        self._ref = weakref.ref(loader)

    @property
    def _loader(self):
        loader = self._ref()
        if loader is None:
            raise ReferenceError("this sampler's fastfeed.Loader no longer exists")
        return loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._loader.epoch

    @property
    def num_replicas(self) -> int:
        return self._loader.world.world_size

    @property
    def rank(self) -> int:
        return self._loader.world.rank

    @property
    def shuffle(self) -> bool:
        return self._loader.settings.shuffle

    @property
    def drop_last(self) -> bool:
        return self._loader.settings.drop_last

    @property
    def seed(self) -> int:
        return self._loader.settings.seed

    def __len__(self) -> int:
        return self._loader.samples_per_epoch

    def __iter__(self):
        return iter(self._loader.epoch_plan().indices.tolist())


class AccelerateState:
    """Accelerate's dataloader-state protocol for one iteration of a Loader.

    Accelerate keeps a process-wide `GradientState`; its own DataLoader wrappers register themselves there while
    they iterate, and `gather_for_metrics` asks the active one whether this is the last batch (`end_of_dataloader`)
    and how many gathered samples of that batch are real (`remainder`; -1 = unknown, 0 = all). A Loader does the
    same when an Accelerator exists in the process, and nothing at all otherwise (accelerate is never imported).
    """

    def __init__(self, loader, plan):
        self._loader = loader
        self._state = _gradient_state()
        loader.end_of_dataloader = False
        loader.remainder = _remainder(plan)

    def __enter__(self):
        if self._state is not None:
            self._state._add_dataloader(self._loader)
        return self

    def last_batch(self) -> None:
        self._loader.end_of_dataloader = True

    def __exit__(self, *exc):
        if self._state is not None:
            self._state._remove_dataloader(self._loader)
        self._loader.end_of_dataloader = False


def _gradient_state():
    state = sys.modules.get("accelerate.state")
    cls = getattr(state, "GradientState", None)
    if cls is None or not getattr(cls, "_shared_state", None):
        return None  # no Accelerator (nor its state) in this process
    return cls()


def _remainder(plan) -> int:
    """Real samples in the last step gathered over all ranks (Accelerate's meaning; 0 = the whole step is real).
    Every rank's last batch is `last_batch_size` long and all padding ends the last ranks' last batches
    (sampling._cut), so the gathered last step is its real samples followed by the padding: keeping the first
    `remainder` is exact."""
    real = plan.world.world_size * plan.last_batch_size - plan.total_padding
    return 0 if real == plan.world.world_size * plan.batch_size else real


def seeded_call(fn, batch, *, seed: int, epoch: int, batch_number: int):
    """fn(images, labels) for a classification batch (a tuple), fn(batch) for a detection batch (a dict), with
    torch's (CPU and the images' GPU), numpy's and `random`'s global generators seeded from (seed, epoch,
    batch_number) and restored afterwards: the same batch is transformed the same way in every run, resumed or not,
    and the caller's own random streams are left exactly as they were."""
    ss = np.random.SeedSequence([seed, epoch, batch_number, 0x6D6978])  # last word: "mix", apart from other seeds
    torch_seed, np_seed, py_seed = (int(x) for x in ss.generate_state(3, dtype=np.uint32))
    images = batch[0] if isinstance(batch, tuple) else batch["images"]
    devices = [images.device.index or 0] if images.device.type == "cuda" else []
    np_state, py_state = np.random.get_state(), random.getstate()
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(torch_seed)
        np.random.seed(np_seed)
        random.seed(py_seed)
        try:
            out = fn(*batch) if isinstance(batch, tuple) else fn(batch)
        finally:
            np.random.set_state(np_state)
            random.setstate(py_state)
    if isinstance(batch, tuple):
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError(f"batch_transform must return (images, labels), got {type(out).__name__}")
        return tuple(out)
    if not isinstance(out, dict):
        raise TypeError(f"batch_transform must return the batch dict, got {type(out).__name__}")
    return out
