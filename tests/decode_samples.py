"""Encoded test records in every colour mode the decoders must turn into RGB, made from one RGB photo with PIL.

Used by tests/test_decode*.py and tools/gpu_selftest.py (which runs where scikit-image may be missing, so the
photo is passed in). Also the torchvision reference transform both compare against.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image

__all__ = ["colour_variants", "corrupt_variants", "torchvision_eval_reference"]


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


def colour_variants(rgb: np.ndarray) -> dict[str, bytes]:
    """name -> encoded bytes; each decodes (in PIL) to an image whose RGB rendering matches `rgb`'s content."""
    im = Image.fromarray(np.ascontiguousarray(rgb[..., :3]).astype(np.uint8), "RGB")
    gray = im.convert("L")
    rgba = im.convert("RGBA")
    rgba.putalpha(128)
    g16 = Image.fromarray((np.asarray(gray).astype(np.uint16) * 257), "I;16")
    return {
        "jpeg_baseline": _save(im, "JPEG", quality=90),
        "jpeg_progressive": _save(im, "JPEG", quality=90, progressive=True),
        "jpeg_444": _save(im, "JPEG", quality=90, subsampling=0),
        "jpeg_gray": _save(gray, "JPEG", quality=90),
        "jpeg_cmyk": _save(im.convert("CMYK"), "JPEG", quality=90),
        "png_rgb": _save(im, "PNG"),
        "png_gray": _save(gray, "PNG"),
        "png_palette": _save(im.convert("P", palette=Image.ADAPTIVE, colors=256), "PNG"),
        "png_rgba": _save(rgba, "PNG"),
        "png_gray16": _save(g16, "PNG"),
    }


def corrupt_variants(good_jpeg: bytes) -> dict[str, bytes]:
    """Records a decoder must reject (not crash on)."""
    return {
        "empty": b"",
        "text": b"this is not an image at all" * 10,
        "truncated_jpeg": good_jpeg[: len(good_jpeg) // 3],
        "jpeg_header_only": good_jpeg[:200],
    }


def torchvision_eval_reference(data: bytes, image_size: int, mean, std):
    """torchvision's standard eval transform on a PIL decode: float32 [3, S, S]."""
    import torchvision.transforms as T

    from fastfeed.decode.crop import eval_resize_size

    img = Image.open(io.BytesIO(data)).convert("RGB")
    tf = T.Compose([
        T.Resize(eval_resize_size(image_size)),
        T.CenterCrop(image_size),
        T.ToTensor(),
        T.Normalize(mean, std),
    ])
    return tf(img)
