"""Detection: YOLO-style augmentation drawn before decoding (geometry.py, pure numpy), its CPU renderer (render.py),
the batch decoder (decoder.py) and the client helpers (clients.py). The package root holds only the geometry's names,
so `from fastfeed.detect import DetectAugment` imports neither PIL nor torch."""
from __future__ import annotations

from fastfeed.detect.geometry import BatchGeometry, DetectAugment, Tile, box_candidates, plan_batch, transform_boxes

__all__ = ["DetectAugment", "BatchGeometry", "Tile", "plan_batch", "transform_boxes", "box_candidates"]
