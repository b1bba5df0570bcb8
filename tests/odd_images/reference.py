"""The reference the decoders are held to: torchvision's eval transform on PIL's reading of the ORIGINAL file,
under the decode contract's rules, written independently of fastfeed's decoders (PIL + numpy only, so the
device tool can use it without torchvision).

torchvision's `Resize(R)` on a PIL image is PIL's antialiased bilinear resize to (short side R, long side
int(R * long / short)); `CenterCrop(S)` then crops at int(round((new - S) / 2)). `ImageFolder`'s loader is
`Image.open(f).convert("RGB")`; the contract adds: EXIF orientation by PIL's `ImageOps.exif_transpose` under
policy "exif", 16-bit grey -> v >> 8 (PIL would clip).
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps

__all__ = ["reference_rgb", "reference_eval"]


def reference_rgb(data: bytes, orientation: str) -> Image.Image:
    im = Image.open(io.BytesIO(data))  # the first frame of an animation
    if orientation == "exif":
        im = ImageOps.exif_transpose(im)
    else:
        im.load()
    if im.mode == "I" or im.mode.startswith("I;16"):
        im = Image.fromarray(np.clip(np.asarray(im).astype(np.int64) >> 8, 0, 255).astype(np.uint8), "L")
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
    return im.convert("RGB")


def reference_eval(data: bytes, image_size: int, orientation: str = "ignore") -> np.ndarray:
    """uint8 [S, S, 3]: torchvision's Resize(round(S / 0.875)) + CenterCrop(S) of the contract's image."""
    im = reference_rgb(data, orientation)
    S = image_size
    R = int(round(S / 0.875))
    w, h = im.size
    if w <= h:
        nw, nh = R, int(R * h / w)
    else:
        nw, nh = int(R * w / h), R
    im = im.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - S) / 2.0)), int(round((nw - S) / 2.0))
    return np.asarray(im.crop((left, top, left + S, top + S)))
