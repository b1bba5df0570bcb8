"""A source tree for pack tests: demo photos in class folders plus the odd-image corpus and an empty file in `odd/`,
so one pack meets accepted, fixed, converted and rejected files (needs fastfeed for the demo photos)."""
from __future__ import annotations

from pathlib import Path

from odd_images.build import build_corpus


def build_mixed_tree(root: Path, seed: int) -> Path:
    from fastfeed.demo_data import make_dataset

    make_dataset(root, num_images=60, num_classes=3, seed=seed, workers=1)
    cases = build_corpus(str(root / "odd"))
    assert any(c.change for c in cases) and any(c.expect == "reject" for c in cases)
    (root / "odd" / "empty.jpg").write_bytes(b"")
    return root
