"""Issue 14: which nvJPEG a process decodes with, the chroma mode fastfeed picks from it, and what that does to the
loader's rate on large photos.

    python3 benchmarks/h200/nvjpeg_probe.py --first torchvision --data /tmp/ffbench/phone-wds
    python3 benchmarks/h200/nvjpeg_probe.py --first dali --data /tmp/ffbench/phone-wds

--first torchvision imports torchvision before the Loader (as a training script that builds a torchvision model
does: its bundled nvJPEG is then the process's); --first dali builds the Loader first (DALI's own nvJPEG is loaded).
Prints the nvJPEG libraries mapped and their version at each point, the decoders' chroma mode, the time to the first
batch and the loader's rate alone (decoder="dali", --batches batches after the first). Run on 2026-11-30 with a
fastfeed (commit 4ec5be8) that chose the cropped decode when the process's nvJPEG was >= 13.2; main decodes whole
images on the GPU in every process (decode/dali.py, chroma_mode), so today the chroma printed is always "full".
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# Why ask the process: DALI's decoders (nvImageCodec) open "libnvjpeg.so.13", and the dynamic linker hands back any
# library with that soname already loaded (torchvision's bundled copy is one) before it looks at DALI's own copy.
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


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--first", choices=("torchvision", "dali"), required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import torch

    points = []

    def point(label):
        points.append({"at": label, "mapped": mapped_nvjpeg(), "version": nvjpeg_version()})
        print(f"[nvjpeg {args.first}-first] {label}: {points[-1]['version']} {points[-1]['mapped']}", flush=True)

    torch.ones(1, device="cuda").sum().item()
    point("torch + CUDA")
    if args.first == "torchvision":
        import torchvision  # noqa: F401

        point("import torchvision")
    import fastfeed

    t0 = time.perf_counter()
    loader = fastfeed.Loader(args.data, batch_size=256, train=True, image_size=224, device="cuda",
                             dtype=torch.float16, channels_last=True, decoder="dali")
    it = iter(loader)
    next(it)
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    chroma = sorted({d.chroma for d in loader._decoders})
    point("Loader built, first batch")
    t1 = time.perf_counter()
    n = 0
    for _ in range(args.batches):
        try:
            x, _ = next(it)
        except StopIteration:
            it = iter(loader)
            x, _ = next(it)
        n += x.shape[0]
    torch.cuda.synchronize()
    rate = n / (time.perf_counter() - t1)
    loader.close()
    if args.first == "dali":
        import torchvision  # noqa: F401

        point("import torchvision after")
    res = {"first": args.first, "data": args.data, "chroma": chroma, "first_batch_s": first, "images_per_s": rate,
           "points": points, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "gpu": torch.cuda.get_device_name(0)}
    print(f"[nvjpeg {args.first}-first] chroma {chroma}: first batch {first:.2f} s, alone {rate:,.0f} img/s",
          flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
