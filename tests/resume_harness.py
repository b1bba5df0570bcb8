"""A reusable save/load-state check for anything that iterates like `fastfeed.Loader`, after torchdata's
`test/nodes/utils.py::run_test_save_load_state`.

    from resume_harness import run_test_save_load_state
    run_test_save_load_state(lambda: fastfeed.Loader(path, ...), midpoint=2)

One uninterrupted reference run records every batch of epochs 0 .. later_epoch+1 (labels and a hash of the exact
image bytes) and takes `state_dict()` at four points, the way training programs do: before anything ran (initial),
after `midpoint` batches of epoch 0 and of `later_epoch` (taken mid-iteration, while the loop is suspended on a
batch, as a checkpoint callback does) and after epoch 0 ended. Each state then goes through JSON (what
checkpoints store must survive that), into a loader built fresh by `factory` (a new process would do no more),
and the batches it yields must be exactly the reference's: the rest of that epoch, then the next full epoch.
One more restore goes into the reference loader itself after it ran ahead (an in-process rollback), driven by
`loader.sampler.set_epoch(e)` as torchvision-style loops do, and preceded by a bare `iter(loader)` that is never
advanced (Lightning calls `iter()` to check an object is iterable): neither may change what comes out.

Besides the batches, the harness checks the lengths frameworks read: `len(loader)` is always a full epoch's
batch count for this rank, and `loader.batches_left` is what remains of the current (or pending) epoch.
"""
from __future__ import annotations

import json
from typing import Callable, Iterable

from clients.common import batch_digest

__all__ = ["run_test_save_load_state"]


def _take(loader, *, start_epoch: int | None, epochs: int, digest) -> list[list[dict]]:
    """`epochs` successive `for` loops over `loader`; with start_epoch, each preceded by sampler.set_epoch."""
    out = []
    for e in range(epochs):
        if start_epoch is not None:
            loader.sampler.set_epoch(start_epoch + e)
        out.append([digest(images, labels) for images, labels in loader])
    return out


def _check(what: str, got: list[list[dict]], want: Iterable[list[dict]]) -> None:
    want = list(want)
    for e, (g, w) in enumerate(zip(got, want)):
        assert len(g) == len(w), f"{what}: iteration {e} gave {len(g)} batches, the uninterrupted run {len(w)}"
        for k, (bg, bw) in enumerate(zip(g, w)):
            assert bg["labels"] == bw["labels"], f"{what}: iteration {e} batch {k}: labels differ"
            assert bg["images"] == bw["images"], f"{what}: iteration {e} batch {k}: image bytes differ"


def run_test_save_load_state(factory: Callable[[], object], *, midpoint: int, later_epoch: int = 2,
                             digest: Callable = batch_digest) -> list[list[dict]]:
    """Check exact resume from the initial state, mid-epoch 0, end of epoch 0 and mid `later_epoch`.

    factory: builds a fresh loader (same arguments every call). midpoint: batches taken before the mid-epoch
    states (0 < midpoint < batches per epoch). Returns the reference run's batch digests, one list per epoch.
    """
    ref = factory()
    full = len(ref)
    assert 0 < midpoint < full, f"midpoint must be inside an epoch of {full} batches, got {midpoint}"
    assert ref.batches_left == full, f"a fresh loader has {ref.batches_left} batches left, not {full}"
    states = {"initial": ref.state_dict()}
    epochs: list[list[dict]] = []
    for e in range(later_epoch + 2):
        batches = []
        for k, (images, labels) in enumerate(ref):
            batches.append(digest(images, labels))
            assert len(ref) == full, f"len(loader) changed to {len(ref)} during epoch {e} (full epoch: {full})"
            if k + 1 == midpoint and e in (0, later_epoch):
                assert ref.batches_left == full - midpoint, \
                    f"epoch {e}: {ref.batches_left} batches left after {midpoint} of {full}"
                states[f"mid-epoch {e}"] = ref.state_dict()
        assert len(batches) == full, f"epoch {e} gave {len(batches)} batches, len(loader) said {full}"
        if e == 0:
            states["end of epoch 0"] = ref.state_dict()
        epochs.append(batches)

    def restore(name: str):
        loader = factory()
        loader.load_state_dict(json.loads(json.dumps(states[name])))  # what a checkpoint file keeps
        return loader

    cases = {  # state -> (expected batches left, expected next two iterations)
        "initial": (full, [epochs[0], epochs[1]]),
        "mid-epoch 0": (full - midpoint, [epochs[0][midpoint:], epochs[1]]),
        "end of epoch 0": (full, [epochs[1], epochs[2]]),
        f"mid-epoch {later_epoch}": (full - midpoint, [epochs[later_epoch][midpoint:], epochs[later_epoch + 1]]),
    }
    for name, (left, want) in cases.items():
        loader = restore(name)
        assert len(loader) == full, f"restored from {name}: len(loader) is {len(loader)}, a full epoch is {full}"
        assert loader.batches_left == left, f"restored from {name}: batches_left {loader.batches_left} != {left}"
        _check(f"restored from {name}", _take(loader, start_epoch=None, epochs=2, digest=digest), want)
        loader.close()

    # Roll the reference loader itself back to mid-epoch 0, as a loop driven by set_epoch would continue.
    ref.load_state_dict(states["mid-epoch 0"])
    iter(ref)  # a framework's "is it iterable?" probe: must not start (or use up) the pending epoch
    assert ref.batches_left == full - midpoint, f"after a bare iter(): batches_left {ref.batches_left}"
    _check("rolled back to mid-epoch 0 with sampler.set_epoch", _take(ref, start_epoch=0, epochs=2, digest=digest),
           [epochs[0][midpoint:], epochs[1]])
    ref.close()
    return epochs
