"""The promise to users, end to end on the odd-image corpus: what `fastfeed pack` accepts, `fastfeed verify`
accepts and every CPU decoder path of the Loader decodes — nothing skipped, nothing crashed, under both orientation
policies — and the pack summary counts what was stored differently."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastfeed
from odd_images.build import build_corpus

pytestmark = pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")


@pytest.fixture(scope="module")
def odd_packed(tmp_path_factory, pack_cli):
    root = tmp_path_factory.mktemp("odd-e2e")
    cases = build_corpus(str(root / "src" / "odd"))  # one class folder
    out = {}
    # WebDataset with the default --jpeg baseline (progressive JPEGs transcoded), LMDB with every byte kept where
    # the contract allows (--jpeg keep): the corpus states the change code of each file for that mode.
    out["wds"] = root / "wds"
    pack_cli(root / "src", out["wds"], "--format", "wds")
    out["lmdb"] = root / "lmdb"
    pack_cli(root / "src", out["lmdb"], "--format", "lmdb", "--jpeg", "keep")
    return cases, out


@pytest.mark.integration  # the verify CLI as a process
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_pack_accepts_what_the_contract_says_and_verify_agrees(odd_packed, fmt):
    cases, out = odd_packed
    accepted = [c for c in cases if c.expect == "accept"]
    manifest = json.loads((out[fmt] / "fastfeed.json").read_text())
    with fastfeed.open_dataset(out[fmt]) as ds:
        assert len(ds) == len(accepted)
    rejected = [json.loads(line) for line in (out[fmt] / "rejected.jsonl").read_text().splitlines() if line]
    assert sorted(Path(r["path"]).name for r in rejected) == sorted(c.name for c in cases if c.expect == "reject")
    want = {}
    for c in accepted:
        if c.change:
            want[c.change] = want.get(c.change, 0) + 1
    if fmt == "lmdb":
        assert manifest.get("changes", {}) == want
    else:  # baseline mode may transcode more (progressive JPEGs), never less
        assert all(manifest["changes"].get(k, 0) >= v for k, v in want.items())
    proc = subprocess.run([sys.executable, "-m", "fastfeed.cli", "verify", str(out[fmt])], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("decoder", ["cpu-pil", "cpu-dali"])
@pytest.mark.parametrize("orientation", ["ignore", "exif"])
@pytest.mark.parametrize("train", [False, True])
def test_every_packed_image_decodes_on_every_cpu_path(odd_packed, decoder, orientation, train):
    _, out = odd_packed
    with fastfeed.Loader(out["wds"], batch_size=8, train=train, image_size=48, device="cpu", decoder=decoder,
                         orientation=orientation, num_threads=1, drop_last=False, on_error="raise") as L:
        n = 0
        for images, labels in L:
            assert images.shape[1:] == (3, 48, 48) and torch.isfinite(images).all()
            n += images.shape[0]
        assert n == len(L.dataset)
        assert L.stats()["skipped"]["total"] == 0
