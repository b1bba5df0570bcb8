"""`GpuDetectDecoder`: DetectDecoder's batch with its two pixel steps on the GPU. DALI decodes each image whole
(hardware JPEG decoder where there is one; decode/dali.py `decode_whole`) into one device buffer, and gpu_render.py
draws the batch's tiles from it to the bit of the CPU renderer's arithmetic. The geometry, the boxes and the
replacement of bad samples are DetectDecoder's, so both paths give the same boxes for the same (seed, epoch, ids).
"""
from __future__ import annotations

import numpy as np
import torch

from fastfeed.decode.dali import DaliDecoder
from fastfeed.detect.decoder import DetectDecoder
from fastfeed.detect.gpu_render import render_batch

__all__ = ["GpuDetectDecoder", "dali_orientation"]


def dali_orientation(orientations) -> str:
    """DALI's policy for a table's EXIF tags (None: the stored frame). DALI displays an image by the tag it reads
    itself, so it is asked to only where the table has a tag to apply: a file whose tag only DALI would read (another
    format's EXIF) then stays as the table says, and DetectDecoder's size check catches the rest."""
    return "exif" if orientations is not None and bool((np.asarray(orientations) != 1).any()) else "ignore"


class GpuDetectDecoder(DetectDecoder):
    """DetectDecoder's arguments, the device a CUDA one, plus DALI's: batch_size (largest batch), hw_decoder_load,
    pinned_input and preallocate (decode/dali.py DaliDecoder)."""

    def __init__(self, *, batch_size: int, hw_decoder_load: float, pinned_input: bool = False, preallocate=None,
                 **common):
        super().__init__(**common)
        if self.device.type != "cuda":
            raise ValueError(f"GpuDetectDecoder decodes on a CUDA device, got {self.device}")
        if not self.augment.axis_aligned and self.train:
            raise ValueError("rotated or sheared tiles (degrees, shear) are drawn by the CPU renderer")
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self._dali = DaliDecoder(device_id=index, batch_size=batch_size, num_threads=common["num_threads"],
                                 hw_decoder_load=hw_decoder_load, on_error=self.on_error, pinned_input=pinned_input,
                                 preallocate=preallocate, whole_images=True,
                                 orientation=dali_orientation(self.orientations))

    @classmethod
    def from_settings(cls, s, targets, widths, heights, orientations=None) -> "GpuDetectDecoder":
        return cls(**cls.settings_kwargs(s, targets, widths, heights, orientations), batch_size=s.batch_size,
                   hw_decoder_load=s.hw_decoder_load, pinned_input=s.pinned_input, preallocate=s.preallocate)

    def _decode_all(self, samples, request, drawn):
        whole = self._dali.decode_whole(samples, request.pil)
        return whole, whole.bad

    def _decoded_sizes(self, decoded):
        return decoded.size

    def _redecode_where_short(self, decoded, samples, request, src, geometry) -> None:
        """Nothing to do: DALI decodes every image whole, never at a draft."""

    def _render(self, decoded, src, geometry, hsv: bool) -> torch.Tensor:
        # `hsv` is never asked for here: on a CUDA device __call__ applies the gains to the whole batch
        return render_batch(decoded.flat, decoded.offset[src], decoded.size[src], geometry)

    def close(self) -> None:
        self._dali.close()
        super().close()
