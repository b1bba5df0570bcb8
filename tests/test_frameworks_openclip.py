"""OpenCLIP trains on image-text shards written by the webdataset library and adopted by `fastfeed index`, and a run
resumed mid-epoch from its checkpoint trains exactly the rest: the same captions with the same pixels, and the same
losses bit for bit (tests/clients/openclip_train.py, one CPU thread, in its own process).
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from clients.common import client_env
from fastfeed.pack.index import index_shards

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).parent / "clients" / "openclip_train.py"
N, BATCH, EPOCHS = 40, 8, 2  # 5 steps per epoch
SAVE_AT = 7  # mid-way through epoch 1
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """img2dataset's layout: KEY.jpg, KEY.txt (the caption), KEY.json (its metadata), no labels."""
    root = tmp_path_factory.mktemp("openclip") / "shards"
    root.mkdir()
    rng = np.random.default_rng(0)
    with wds.ShardWriter(str(root / "%05d.tar"), maxcount=16, verbose=0) as sink:
        for i in range(N):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(buf, format="JPEG")
            sink.write({"__key__": f"{i:09d}", "jpg": buf.getvalue(), "txt": f"picture number {i} of {N}",
                        "json": {"url": f"https://example.com/{i}.jpg", "width": 48, "height": 40}})
    index_shards(str(root))
    return root


def run(shards: Path, out: Path, tag: str, *extra: str) -> list[dict]:
    cmd = [sys.executable, str(SCRIPT), "--train", str(shards), "--out", str(out), "--tag", tag, "--epochs",
           str(EPOCHS), "--batch-size", str(BATCH), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=client_env())
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-6000:]}"
    return json.loads((out / f"{tag}.json").read_text())


def test_openclip_trains_on_adopted_shards_and_resumes_mid_epoch_exactly(shards, tmp_path):
    ref = run(shards, tmp_path, "reference", "--save-at", str(SAVE_AT))
    assert [s["step"] for s in ref] == list(range(1, EPOCHS * N // BATCH + 1))
    for e in range(EPOCHS):  # every caption once per epoch
        captions = sorted(c for s in ref if s["epoch"] == e for c in s["txt"])
        assert captions == sorted(f"picture number {i} of {N}" for i in range(N))
    assert all(np.isfinite(s["loss"]) for s in ref)

    resumed = run(shards, tmp_path, "resumed", "--resume", str(tmp_path / "ckpt.pt"))
    assert [s["step"] for s in resumed] == [s["step"] for s in ref if s["step"] > SAVE_AT]
    for got, want in zip(resumed, ref[SAVE_AT:]):
        assert (got["txt"], got["images"]) == (want["txt"], want["images"]), f"step {got['step']}: other samples"
        assert got["loss"] == want["loss"], f"step {got['step']}: loss {got['loss']} != {want['loss']}"
