"""The samples DALI's decoders hand to the decode contract's PIL decoder (decode/cpu.py): those only PIL reads as the
contract says (Windows.pil, from samples.npz `pil_only`: CMYK or RGB-colour JPEGs, 16-bit or transparent PNGs,
TIFF, ...). A dataset rarely holds more than a few, so the decoder is built on first use, with the output format of
the DALI decoder it serves. Its failures come back by position, for the batch's replacement rule (decode/base.py).
"""
from __future__ import annotations

import numpy as np

from fastfeed.decode.base import CorruptSampleError

__all__ = ["ContractRoute", "routed"]


def routed(pil) -> list[int]:
    """The positions flagged in `pil` (Windows.pil), [] for None."""
    return [] if pil is None else np.flatnonzero(np.asarray(pil, dtype=bool)).tolist()


class ContractRoute:
    """`make()` -> the PilDecoder to use, called once, when a batch first routes a sample."""

    def __init__(self, make):
        self._make = make
        self._decoder = None

    def _get(self):
        if self._decoder is None:
            self._decoder = self._make()
        return self._decoder

    def crop(self, samples, windows, positions: list[int]):
        """`positions` of the batch cropped and resized as `windows` say: (their images in the decoder's output
        format, or None when none decodes, {position: (code, detail)} of those that fail)."""
        if not positions:
            return None, {}
        try:
            res = self._get()([samples[p] for p in positions], windows.take(positions))
        except CorruptSampleError as e:  # none of them decodes
            return None, {positions[p]: (c, d) for p, c, d in zip(e.positions, e.codes, e.details)}
        return res.images, {positions[r.position]: (r.code, r.detail) for r in res.replaced}

    def whole(self, samples, positions: list[int]):
        """`positions` decoded whole: ({position: uint8 [h, w, 3]}, {position: (code, detail)})."""
        pixels, bad = {}, {}
        if positions:
            for p, (img, err) in zip(positions, self._get().whole([samples[p] for p in positions], pil_only=True)):
                if err is None:
                    pixels[p] = img
                else:
                    bad[p] = err
        return pixels, bad

    def close(self) -> None:
        if self._decoder is not None:
            self._decoder.close()
