"""Encoded test records in every colour mode the decoders must turn into RGB, made from one RGB photo with PIL.

The photo is passed in, so that the helpers need no scikit-image. Also the torchvision reference transform the decoder
tests compare against.
"""
from __future__ import annotations

import io
from collections.abc import Mapping

import numpy as np
from PIL import Image

__all__ = ["colour_variants", "corrupt_variants", "torchvision_eval_reference"]


def _save(img: Image.Image, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    img.save(b, fmt, **kw)
    return b.getvalue()


def colour_variants(rgb: np.ndarray) -> Mapping[str, bytes]:
    """name -> encoded bytes; each decodes (in PIL) to an image whose RGB rendering matches `rgb`'s content. A record
    is encoded when first read: all ten of a 1333x889 photo take ~2 s, and most tests read one or two."""
    return _ColourVariants(rgb)


class _ColourVariants(Mapping):
    NAMES = ("jpeg_baseline", "jpeg_progressive", "jpeg_444", "jpeg_gray", "jpeg_cmyk",
             "png_rgb", "png_gray", "png_palette", "png_rgba", "png_gray16")

    def __init__(self, rgb: np.ndarray):
        self._im = Image.fromarray(np.ascontiguousarray(rgb[..., :3]).astype(np.uint8), "RGB")
        self._records: dict[str, bytes] = {}

    def __iter__(self):
        return iter(self.NAMES)

    def __len__(self) -> int:
        return len(self.NAMES)

    def __getitem__(self, name: str) -> bytes:
        if name not in self.NAMES:
            raise KeyError(name)
        if name not in self._records:
            self._records[name] = self._encode(name)
        return self._records[name]

    def _encode(self, name: str) -> bytes:
        im = self._im
        gray = im.convert("L")
        if name == "jpeg_baseline":
            return _save(im, "JPEG", quality=90)
        if name == "jpeg_progressive":
            return _save(im, "JPEG", quality=90, progressive=True)
        if name == "jpeg_444":
            return _save(im, "JPEG", quality=90, subsampling=0)
        if name == "jpeg_gray":
            return _save(gray, "JPEG", quality=90)
        if name == "jpeg_cmyk":
            return _save(im.convert("CMYK"), "JPEG", quality=90)
        if name == "png_rgb":
            return _save(im, "PNG")
        if name == "png_gray":
            return _save(gray, "PNG")
        if name == "png_palette":
            return _save(im.convert("P", palette=Image.ADAPTIVE, colors=256), "PNG")
        if name == "png_rgba":
            rgba = im.convert("RGBA")
            rgba.putalpha(128)
            return _save(rgba, "PNG")
        assert name == "png_gray16"
        return _save(Image.fromarray((np.asarray(gray).astype(np.uint16) * 257), "I;16"), "PNG")


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
