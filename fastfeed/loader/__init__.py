"""`fastfeed.Loader` and the pieces it composes for one iteration.

    loader.py     Loader: the DataLoader-like surface, resume, the NOTEs on the pipeline, shutdown and read-ahead
    settings.py   every argument resolved and validated once, into a frozen LoaderSettings
    epoch.py      EpochRun: one iteration's decode workers and the in-order hand-off
    assemble.py   BatchAssembler: a ring batch -> (images, labels), bad samples replaced
    ring.py       PrefetchRing: the native read-ahead ring into pinned slots
    stats.py, compat.py (what frameworks read from a DataLoader), lifecycle.py (fork and interpreter exit)
"""
from __future__ import annotations

__all__ = ["Loader", "LoaderError"]


def __getattr__(name: str):
    # Lazy: importing one piece (the ring, the stats) does not build the whole Loader's import graph.
    if name == "Loader":
        from fastfeed.loader.loader import Loader

        return Loader
    if name == "LoaderError":
        from fastfeed.loader.assemble import LoaderError

        return LoaderError
    raise AttributeError(f"module 'fastfeed.loader' has no attribute {name!r}")
