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
from fastfeed.commands.inspect import summarize
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


def _frames(data: bytes) -> list:
    """Every frame of an image file as PIL holds it: its own mode (alpha, 16-bit, CMYK, palette), no conversion."""
    import io

    import numpy as np
    from PIL import Image, ImageSequence

    with Image.open(io.BytesIO(data)) as im:
        return [(f.mode, np.asarray(f).copy()) for f in ImageSequence.Iterator(im)]


@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
def test_pack_keeps_every_pixel_channel_and_bit(odd_packed, fmt):
    """Lossless packing: each stored image holds its source's every frame in its own mode (alpha, 16-bit, CMYK and
    palette included); only the fixes that change no pixel (a trailer trimmed, junk dropped, a JPEG transcoded
    to baseline) change bytes, and what only PIL reads as the contract says is marked for it."""
    import numpy as np

    cases, out = odd_packed
    by_name = {c.name: c for c in cases}
    with fastfeed.open_dataset(out[fmt]) as ds:
        assert ds.manifest.pil_only == sum(c.pil_only for c in cases if c.expect == "accept") > 0
        assert f"pil only:    {ds.manifest.pil_only}  (stored as they are" in summarize(ds.manifest)
        for i in range(len(ds)):
            case = by_name[Path(str(ds.sources[i])).name]
            original, stored = Path(case.path).read_bytes(), ds.read(i)
            assert bool(ds.pil_only[i]) == case.pil_only, case.name
            if not ds.changes[i]:
                assert stored == original, case.name
            try:
                a = _frames(original)
            except OSError:  # junk before the first marker, which this PIL cannot open: only the junk is dropped
                assert case.change == "dropped_leading_junk" and original.endswith(stored[2:]), case.name
                continue
            b = _frames(stored)
            assert [m for m, _ in a] == [m for m, _ in b], case.name
            assert all(np.array_equal(x, y) for (_, x), (_, y) in zip(a, b)), case.name


@pytest.mark.parametrize("decoder", ["cpu-pil", "cpu-dali"])
def test_the_loader_gives_torchvisions_pixels_of_every_source(odd_packed, decoder):
    """Pack + Loader in evaluation: each image within the contract's 2/255 of torchvision's eval transform of its
    source file; DALI's decoder gets the `pil_only` flags from the sample table and hands those samples to PIL."""
    import numpy as np

    from odd_images.reference import reference_eval

    cases, out = odd_packed
    by_name = {c.name: c for c in cases}
    with fastfeed.Loader(out["lmdb"], batch_size=16, train=False, image_size=48, device="cpu", decoder=decoder,
                         dtype=torch.uint8, num_threads=1, drop_last=False, shuffle=False, on_error="raise") as L:
        sources = [by_name[Path(str(s)).name] for s in L.dataset.sources]
        at = 0
        for images, _ in L:
            for img in images.permute(0, 2, 3, 1).numpy().astype(np.int16):
                case = sources[at]
                data = Path(case.path).read_bytes()
                try:
                    ref = reference_eval(data, 48)
                except OSError:  # a file only its fix makes readable (junk after SOI): its stored form
                    ref = reference_eval(L.dataset.read(at), 48)
                assert np.abs(img - ref.astype(np.int16)).mean() < 2.0, (case.name, decoder)
                at += 1
        assert at == len(sources)


def test_without_checksums_every_stored_file_still_decodes(odd_packed):
    """verify_checksums=False: the Loader holds back JPEGs and PNGs whose headers pack would not have stored for
    the GPU's decoders, but not what pack stored on purpose for PIL alone (`pil_only`, e.g. a PNG whose chunk
    structure only PIL reads): every sample decodes, none is replaced."""
    cases, out = odd_packed
    with fastfeed.Loader(out["lmdb"], batch_size=16, train=False, image_size=32, device="cpu", decoder="cpu-dali",
                         dtype=torch.uint8, verify_checksums=False, drop_last=False, shuffle=False,
                         on_error="raise") as L:
        assert sum(len(images) for images, _ in L) == sum(c.expect == "accept" for c in cases)
        assert L.stats()["skipped"]["total"] == 0
