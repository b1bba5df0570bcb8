"""Which of nvImageCodec's extension modules a DALI pipeline loads when it is built.

DALI's image decoder creates an nvImageCodec instance when its pipeline is built, and the instance loads every
extension module in nvImageCodec's `extensions` folder, or in $NVIMGCODEC_EXTENSIONS_PATH when that is set (read at
each instance's creation). On a host that sees a GPU the GPU ones (nvJPEG, nvJPEG2000, nvTIFF) set up GPU state as
they load, also for a pipeline on DALI's CPU backend, which never uses them: that setup is most of a CPU pipeline's
build, paid per pipeline (two before the first batch, one per pipeline the tuner tries) by the thumbnails' decoder,
DALI's CPU backend. docs/design/decoders.md#codecs

So a pipeline on the CPU backend is built while the variable names a folder of links to the CPU extensions only.
The folder is made for that build and removed after it: the extensions are loaded by then, and a folder that
outlived its build would be left behind by every process that ends in os._exit (a forked worker's way out). Builds
take one lock, so that a GPU pipeline built meanwhile in another thread never sees that folder. A variable the user
set is left alone: they chose the extensions. DALI's CPU backend decodes JPEGs with libjpeg-turbo and PNGs with
OpenCV either way, so the folder changes no pixels (tests/test_dali_codecs.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import logging
import os
import tempfile
import threading
from pathlib import Path

__all__ = ["VARIABLE", "GPU_EXTENSIONS", "extensions_folder", "extensions_for"]

log = logging.getLogger("fastfeed")

VARIABLE = "NVIMGCODEC_EXTENSIONS_PATH"
# File-name prefixes of the extensions that need a GPU; libjpeg-turbo, OpenCV (PNG), libtiff, BMP and PNM stay.
GPU_EXTENSIONS = ("libnvjpeg_ext", "libnvjpeg2k_ext", "libnvtiff_ext")

_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # A fork while another thread was building (the pipeline tuner builds in the background) copies the lock held,
    # and no thread of the child would ever release it: a Loader built in the child would hang at its first build.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@functools.lru_cache(maxsize=1)
def extensions_folder() -> Path | None:
    """nvImageCodec's own extensions folder: next to libnvimgcodec, in the nvidia-nvimgcodec package DALI loads."""
    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        folder = Path(location) / "extensions"
        if folder.is_dir():
            return folder
    return None


@contextlib.contextmanager
def _cpu_only_folder():
    """A folder of links to the CPU extensions, removed on exit; None where it cannot be made (no extensions folder
    found, no temporary folder, no symbolic links): the pipeline is then built with every extension, as DALI does."""
    source = extensions_folder()
    try:
        made = None if source is None else tempfile.TemporaryDirectory(prefix="fastfeed-nvimgcodec-cpu-",
                                                                        ignore_cleanup_errors=True)
    except OSError as e:
        log.debug("fastfeed: no folder for the CPU nvImageCodec extensions (%s); building with every one", e)
        made = None
    if made is None:
        yield None
        return
    with made as folder:
        try:
            for f in source.iterdir():
                if not f.name.startswith(GPU_EXTENSIONS):
                    os.symlink(f, os.path.join(folder, f.name))
        except OSError as e:
            log.debug("fastfeed: no links to the CPU nvImageCodec extensions (%s); building with every one", e)
            folder = None
        yield folder


def _user_set() -> bool:
    """The variable is in the environment: the C one, which is what nvImageCodec reads (a library can set it there
    without Python's copy, os.environ, knowing)."""
    if VARIABLE in os.environ:
        return True
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    return getenv(VARIABLE.encode()) is not None


@contextlib.contextmanager
def extensions_for(gpu: bool):
    """Held around a DALI pipeline's build (and only the build: the extensions are loaded then). gpu: the pipeline
    runs on a GPU and gets every extension."""
    with _lock:
        if gpu or _user_set():
            yield
            return
        with _cpu_only_folder() as folder:
            if folder is None:
                yield
                return
            # The C environment only, which is what nvImageCodec reads: os.environ, which other threads may be
            # copying, never holds it.
            os.putenv(VARIABLE, folder)
            try:
                yield
            finally:
                os.unsetenv(VARIABLE)
