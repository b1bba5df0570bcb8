"""Every `fastfeed.Loader` alive in this process, and the two process events that must reach each one.

Interpreter exit: `close_live_loaders` closes them before DALI's own atexit hook runs (atexit runs the last
registered first, and `register_exit_hook` is called once a Loader has built its decoders, after DALI registered its
hook on import). DALI's hook shuts every pipeline down and then asserts that none is left; a worker still decoding (a
run reading on into the next epoch, or one left mid-epoch) saw its pipeline fail, built a new one, and the process
aborted (seen 1 exit in 4 on the CPU, and in tests/test_gpu.py).

Fork: a child process must not run the parent's DALI pipelines or CUDA state, not even their destructors (DALI's
segfault in a forked child). After a fork each live Loader is told (`Loader._after_fork`): it refuses to iterate (build
a new Loader in the child) and keeps its decoders alive forever, so that no destructor of the parent's pipelines runs
in the child; the native ring already sees itself closed there.
"""
from __future__ import annotations

import atexit
import os
import sys
import weakref

__all__ = ["track", "forget", "register_exit_hook"]

_live: weakref.WeakSet = weakref.WeakSet()
_exit_hook_registered = False


def track(loader) -> None:
    _live.add(loader)


def forget(loader) -> None:
    _live.discard(loader)


def register_exit_hook() -> None:
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(close_live_loaders)
        _exit_hook_registered = True


def close_live_loaders() -> None:
    for loader in list(_live):
        try:
            loader.close()
        except Exception:  # noqa: BLE001 - exiting: nothing to report to
            pass


def _after_fork_in_child() -> None:
    dali = sys.modules.get("nvidia.dali.pipeline")
    if dali is not None:
        # DALI's atexit hook shuts down every pipeline it knows; in the child those are the parent's, whose threads
        # do not exist here, and the hook would wait for them forever. Pipelines the child builds register anew.
        dali.Pipeline._pipes.clear()
    for loader in list(_live):
        loader._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
