"""The decode contract in code: how any image becomes the RGB pixels every fastfeed decoder delivers.

docs/decode-contract.md is the prose; this module is the PIL rendering of it, used by the CPU decoder, by pack's
conversions (pack/validate.py) and by the tests' reference. PIL only: no numba, no torch.

- Orientation: policy "ignore" (default; torchvision's ImageFolder) or "exif" (the EXIF tag applied, displayed
  size). The tag is read from JPEG APP1 / PNG eXIf by fastfeed.image.headers.exif_orientation on the CPU path and
  by DALI on DALI's; from other formats, and from a JPEG/PNG whose tag those readers disagree on (both only PIL
  decodes), by PIL (`orientation_tag`).
- 16-bit samples -> v >> 8, whatever the content (no stretching, no clipping).
- Alpha (RGBA, LA, PA, palette tRNS) is dropped: the colour channels as stored, exactly torchvision's
  `convert("RGB")`. No compositing: a background colour would make fastfeed differ from ImageFolder by up to
  255/255 on every transparent pixel.
- Animations (GIF, APNG, multi-page TIFF): the first frame.
- CMYK/YCCK JPEG: PIL's conversion. Files of these kinds are stored as they are and decoded by PIL on every path
  (pack's `pil_only`), so the rules apply when they are decoded, never to what is stored.
- ICC profiles: ignored (pixel values as stored), like PIL, DALI and torchvision.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

from fastfeed.constants import DEFAULT_ORIENTATION, ORIENTATIONS
from fastfeed.image.headers import exif_orientation, exif_orientation_plain, pil_read

__all__ = ["TRANSPOSE", "GREY_MODES", "to_rgb", "to_8bit", "orientation_tag", "contract_image"]

# EXIF orientation tag -> the PIL transpose that displays the image (PIL's ImageOps.exif_transpose table).
TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
             5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
             8: Image.Transpose.ROTATE_90}
GREY_MODES = frozenset({"1", "L", "LA", "La", "I", "F", "I;16", "I;16L", "I;16B", "I;16N"})


def to_8bit(img: Image.Image) -> Image.Image:
    """16-bit / 32-bit integer grey -> L by v >> 8; float -> L clipped to [0, 255]; other modes unchanged.
    (PIL already opens 16-bit RGB PNGs as RGB keeping the high byte: the same rule.)"""
    mode = img.mode
    if mode == "I" or mode.startswith("I;16"):
        a = np.asarray(img).astype(np.int64) >> 8
        return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "L")
    if mode == "F":
        return Image.fromarray(np.clip(np.asarray(img), 0, 255).astype(np.uint8), "L")
    return img


def to_rgb(img: Image.Image) -> Image.Image:
    """A loaded PIL image -> RGB by the contract's colour rules (module docstring)."""
    if img.mode == "RGB":
        return img
    img = to_8bit(img)
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # PIL warns when a palette with transparency goes straight to RGB
    return img.convert("RGB")


def orientation_tag(data, img: Image.Image, policy: str) -> int:
    """The EXIF transpose to apply to `img` (opened from `data`) under `policy` (1 = none). JPEG and PNG: the tag
    in the file's header (read without PIL, as DALI's decoders read it). TIFF: 1, PIL applies its tag itself as it
    opens one. Other formats (WebP, ...), and a JPEG/PNG whose EXIF readers disagree on
    (headers.exif_orientation_plain): the tag PIL reads."""
    if policy != "exif":
        return 1
    if img.format == "TIFF":
        return 1
    if img.format in ("JPEG", "MPO", "PNG") and exif_orientation_plain(data):
        return exif_orientation(data)
    # Other formats, and a JPEG/PNG whose tag readers disagree on (pack keeps those for this decode alone): PIL's tag,
    # as the reference (ImageOps.exif_transpose) reads it: after loading, which reads a PNG's chunks after its pixels.
    img.load()
    try:
        tag = int(img.getexif().get(0x0112, 1))
    except Exception:  # noqa: BLE001 - a malformed EXIF block means no usable tag, not a bad image
        return 1
    return tag if 1 <= tag <= 8 else 1


def contract_image(data, orientation: str = DEFAULT_ORIENTATION) -> Image.Image:
    """The whole image as every decoder shows it (RGB, first frame, oriented by the policy). Raises on bad data."""
    if orientation not in ORIENTATIONS:
        raise ValueError(f"orientation must be one of {ORIENTATIONS}, got {orientation!r}")
    def opened(readable: bytes) -> Image.Image:
        img = Image.open(io.BytesIO(readable))
        img.load()
        return img

    img = pil_read(opened, bytes(data))  # (without its text where PIL refuses that: headers.py)
    tag = orientation_tag(data, img, orientation)
    if tag != 1:
        img = img.transpose(TRANSPOSE[tag])
    return to_rgb(img)
