"""Which nvJPEG this process decodes with, and its version.

Why it matters: nvJPEG takes cropped (ROI) decodes with interpolated ("fancy") chroma upsampling — what PIL and
torchvision do, and what the decode contract requires — only from version 13.2 on; below it DALI warns and decodes
those images on the CPU (41 img/s measured). So the GPU pipeline decodes whole images unless the nvJPEG in use is
new enough (decode/dali.py, chroma_mode).

Why ask the process and not the installed packages: DALI's decoders (nvImageCodec) open "libnvjpeg.so.13", and the
dynamic linker hands back any library with that soname already loaded before it looks at DALI's own copy.
torchvision 0.29 loads its bundled nvJPEG 13.0.1 (soname libnvjpeg.so.13) at `import torchvision`, so in a training
script that imports torchvision first, DALI decodes with 13.0.1 even where nvidia-nvjpeg 13.3 is installed — the
reason a cropped decode worked in one process on an H200 and fell back to the CPU in another. The library mapped into
the process is the one every decoder of the process uses from then on.
"""
from __future__ import annotations

import ctypes
import os

__all__ = ["mapped_nvjpeg", "nvjpeg_version"]

_PROPERTIES = (0, 1, 2)  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL


def mapped_nvjpeg(maps: str = "/proc/self/maps") -> list[str]:
    """Paths of the nvJPEG libraries mapped into this process (not nvJPEG2000's), sorted; [] where /proc is absent."""
    found = set()
    try:
        with open(maps) as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) == 6:
                    name = os.path.basename(parts[5].strip())
                    # nvJPEG itself, whatever its file is called (torchvision bundles "libnvjpeg.<hash>.so.13");
                    # not nvJPEG2000, not nvImageCodec's extension that loads it ("libnvjpeg_ext.so").
                    if name.startswith("libnvjpeg.") and ".so" in name:
                        found.add(parts[5].strip())
    except OSError:
        return []
    return sorted(found)


def nvjpeg_version() -> tuple[int, int, int] | None:
    """(major, minor, patch) of the one nvJPEG mapped into this process; None when none is mapped yet, when two
    different ones are (which one a decoder uses is then unknown), or when the version cannot be read."""
    paths = mapped_nvjpeg()
    if len(paths) != 1:
        return None
    try:
        lib = ctypes.CDLL(paths[0])  # already mapped: the same library, no second copy
        value = ctypes.c_int()
        version = []
        for prop in _PROPERTIES:
            if lib.nvjpegGetProperty(prop, ctypes.byref(value)) != 0:
                return None
            version.append(value.value)
    except (OSError, AttributeError):
        return None
    return tuple(version)
