"""The decode contract over the odd-image corpus (tests/odd_images/build.py): what pack accepts, stores as it is for
PIL (`pil_only`) and rejects, and that every accepted image decodes on both CPU decoders within 2/255 (mean) of the
reference -- torchvision's eval transform on PIL's reading of the ORIGINAL file under the same policy -- and of each
other. DALI's CPU backend gets the `pil_only` flags as the Loader passes them (Windows.pil), so its routing of those
samples to PIL is what is checked on that path."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fastfeed.decode import crop_windows, make_decoder, oriented_size
from fastfeed.image import jpeg, transcode
from fastfeed.pack.validate import CHANGES, Loaded, LoadOptions, check_image, load_image
from odd_images.build import build_corpus
from odd_images.reference import reference_eval

# PIL warns (it does not fail) on a malformed EXIF block (jpeg_bad_exif.jpg); pytest would make that an error.
pytestmark = pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")

S = 64
TOL = 2.0  # /255, mean abs per image
CPU_KINDS = ("cpu-pil", "cpu-dali")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(str(tmp_path_factory.mktemp("odd")))


@pytest.fixture(scope="module")
def accepted(corpus):
    """(case, original bytes, Loaded) for every file pack accepts (--jpeg keep: the bytes as users give them)."""
    out = []
    for c in corpus:
        res = load_image(c.path, LoadOptions(jpeg_mode="keep"))
        if isinstance(res, Loaded):
            out.append((c, Path(c.path).read_bytes(), res))
    return out


def test_corpus_is_deterministic_and_covers_the_cases(corpus, tmp_path):
    again = build_corpus(str(tmp_path))
    assert [c.name for c in again] == [c.name for c in corpus]
    for a, b in zip(again, corpus):
        assert Path(a.path).read_bytes() == Path(b.path).read_bytes(), a.name
    assert len(corpus) >= 40
    assert {c.change for c in corpus if c.change} >= {"trimmed_trailing_data", "dropped_leading_junk"}
    assert sum(c.pil_only for c in corpus) >= 20
    assert {c.orientation for c in corpus} == set(range(1, 9))


@pytest.mark.parametrize("mode", ["keep", "baseline"])
def test_pack_validation_accepts_converts_and_rejects_as_documented(corpus, mode):
    if mode == "baseline" and not transcode.HAVE_TRANSCODE:
        pytest.skip("native core built without libjpeg")
    for c in corpus:
        res = load_image(c.path, LoadOptions(jpeg_mode=mode))
        if c.expect == "reject":
            assert not isinstance(res, Loaded), c.name
            assert c.reason.lower() in res.reason.lower(), (c.name, res.reason)
            continue
        assert isinstance(res, Loaded), (c.name, res)
        expected = c.change
        if mode == "baseline" and "progressive" in c.name and not c.pil_only:  # (the ones whose scans stop short
            expected = "transcoded_baseline"                                   # are kept: no copy is lossless)
        assert res.change == expected, (c.name, res.change)
        assert res.change is None or res.change in CHANGES
        assert res.orientation == c.orientation, (c.name, res.orientation)
        assert res.pil_only == c.pil_only, (c.name, res.pil_only)
        stored = bytes(res.data)
        if res.pil_only:  # lossless: the source's bytes, for PIL, whose reading gives the table's size
            assert stored == Path(c.path).read_bytes() and not res.hw_decodable, c.name
            with Image.open(c.path) as im:
                assert im.size == (res.width, res.height), c.name
            continue
        # Every decoder gets a JPEG or an 8-bit PNG, whose header agrees with the table's size and orientation.
        info = jpeg.probe(stored)
        assert info.format in ("jpeg", "png") and (info.width, info.height) == (res.width, res.height), c.name
        assert jpeg.exif_orientation(stored) == res.orientation, c.name
        if info.format == "png":
            # bit depth 8, grey / RGB / (untouched, opaque) palette: no alpha, no 16-bit, no animation
            assert stored[24:26] in (b"\x08\x00", b"\x08\x02", b"\x08\x03") and b"acTL" not in stored, c.name
            assert b"tRNS" not in stored, c.name
        if res.change is None:
            assert stored == Path(c.path).read_bytes(), c.name
        if res.change == "trimmed_trailing_data":
            assert Path(c.path).read_bytes().startswith(stored), c.name


def test_rejections_name_the_reason(corpus):
    by_name = {c.name: c for c in corpus}
    r = load_image(by_name["jpeg_12bit_header.jpg"].path, LoadOptions())
    assert "12-bit JPEG" in r.reason and "PIL cannot decode it" in r.reason
    r = load_image(by_name["png_bad_filter_type.png"].path, LoadOptions())
    assert "row 5 has filter type 7" in r.reason and "PIL cannot decode it" in r.reason
    r = load_image(by_name["png_short_phys.png"].path, LoadOptions())
    assert "PIL refuses this PNG's metadata" in r.reason and "pHYs" in r.reason


def _decode_all(kind, stored, widths, heights, tags, policy, channels_last, train=False, seed=0, pil=None):
    W, H = oriented_size(widths, heights, tags, policy)
    win = crop_windows(W, H, np.arange(len(stored)), seed=seed, epoch=0, train=train, image_size=S, pil=pil)
    with make_decoder(kind, device="cpu", image_size=S, dtype=torch.uint8, batch_size=len(stored), num_threads=2,
                      channels_last=channels_last, orientation=policy, draft=False) as d:
        res = d([np.frombuffer(s, dtype=np.uint8) for s in stored], win)
    assert not res.replaced, res.replaced
    return res.images.permute(0, 2, 3, 1).numpy().astype(np.int16)  # NHWC view either way


@pytest.mark.parametrize("policy", ["ignore", "exif"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_every_accepted_image_decodes_the_same_on_both_cpu_decoders(accepted, policy, channels_last):
    stored = [bytes(r.data) for _, _, r in accepted]
    widths = np.array([r.width for _, _, r in accepted])
    heights = np.array([r.height for _, _, r in accepted])
    tags = np.array([r.orientation for _, _, r in accepted], dtype=np.uint8)
    pil = np.array([r.pil_only for _, _, r in accepted])
    out = {k: _decode_all(k, stored, widths, heights, tags, policy, channels_last, pil=pil) for k in CPU_KINDS}
    worst = {}
    for i, (c, original, res) in enumerate(accepted):
        # The original file when PIL reads it; a file only the fix makes readable (junk after SOI) by its fix.
        try:
            ref = reference_eval(original, S, policy).astype(np.int16)
        except OSError:
            ref = reference_eval(stored[i], S, policy).astype(np.int16)
        diffs = {k: float(np.abs(out[k][i] - ref).mean()) for k in CPU_KINDS}
        diffs["pil-dali"] = float(np.abs(out["cpu-pil"][i] - out["cpu-dali"][i]).mean())
        for k, v in diffs.items():
            worst[k] = max(worst.get(k, 0.0), v)
        assert max(diffs.values()) < TOL, (c.name, policy, diffs)
    print(f"\n[{policy}, channels_last={channels_last}] max mean abs diff /255: {worst}")


def test_exif_policy_rotates_and_ignore_does_not(accepted):
    one = [(c, o, r) for c, o, r in accepted if c.name == "jpeg_exif_orientation_6.jpg"]
    (c, original, res), = one
    args = ([bytes(res.data)], np.array([res.width]), np.array([res.height]), np.array([6], dtype=np.uint8))
    shown = _decode_all("cpu-pil", *args, "exif", False)[0]
    stored = _decode_all("cpu-pil", *args, "ignore", False)[0]
    assert np.abs(shown - stored).mean() > 20  # really different pixels
    assert np.abs(shown - reference_eval(original, S, "exif")).mean() < TOL
    assert np.abs(stored - reference_eval(original, S, "ignore")).mean() < TOL


@pytest.mark.parametrize("policy", ["ignore", "exif"])
def test_random_crops_agree_between_cpu_decoders_in_displayed_coordinates(accepted, policy):
    """Train windows (random crops + flips) computed on the displayed size: both decoders crop the same place."""
    stored = [bytes(r.data) for _, _, r in accepted]
    dims = (np.array([r.width for _, _, r in accepted]), np.array([r.height for _, _, r in accepted]),
            np.array([r.orientation for _, _, r in accepted], dtype=np.uint8))
    pil = np.array([r.pil_only for _, _, r in accepted])
    for seed in (1, 2):
        a = _decode_all("cpu-pil", stored, *dims, policy, False, train=True, seed=seed, pil=pil)
        b = _decode_all("cpu-dali", stored, *dims, policy, True, train=True, seed=seed, pil=pil)
        per_image = np.abs(a - b).mean(axis=(1, 2, 3))
        assert per_image.max() < TOL, dict(zip([c.name for c, _, _ in accepted], per_image.round(2)))


def test_oriented_size_swaps_only_for_exif_5_to_8():
    w, h = np.array([120] * 9), np.array([80] * 9)
    tags = np.arange(9, dtype=np.uint8)  # 0 = a bad value, treated like "no tag"
    W, H = oriented_size(w, h, tags, "exif")
    assert W.tolist() == [120] * 5 + [80] * 4 and H.tolist() == [80] * 5 + [120] * 4
    assert [a.tolist() for a in oriented_size(w, h, tags, "ignore")] == [w.tolist(), h.tolist()]
    assert [a.tolist() for a in oriented_size(w, h, None, "exif")] == [w.tolist(), h.tolist()]
    with pytest.raises(ValueError, match="orientation"):
        oriented_size(w, h, tags, "rotate")
    with pytest.raises(ValueError, match="orientation"):
        make_decoder("cpu-pil", device="cpu", orientation="auto")


@pytest.mark.integration  # a child process
def test_dali_exif_never_crashes_on_windows_from_the_stored_size(corpus):
    """Windows computed on the unrotated header size while DALI rotates by EXIF once crashed the process. Run in a
    child so a crash fails this test instead of killing the session. (A file whose tag the readers disagree on never
    reaches DALI: pack keeps it for PIL's decode.)"""
    from fastfeed.image.headers import exif_orientation_plain

    paths = [c.path for c in corpus if c.expect == "accept" and c.orientation >= 5 and c.name.endswith(".jpg")
             and c.change is None and exif_orientation_plain(Path(c.path).read_bytes())]
    assert len(paths) >= 4
    script = textwrap.dedent(f"""
        import numpy as np, torch
        from fastfeed.decode import crop_windows, make_decoder
        from fastfeed.image import jpeg
        data = [open(p, "rb").read() for p in {paths!r}]
        infos = [jpeg.probe(d) for d in data]
        W = np.array([i.width for i in infos]); H = np.array([i.height for i in infos])
        for train in (False, True):
            win = crop_windows(W, H, np.arange(len(data)), seed=3, epoch=0, train=train, image_size=48)
            with make_decoder("cpu-dali", device="cpu", image_size=48, dtype=torch.uint8, batch_size=len(data),
                              num_threads=1, orientation="exif") as d:
                res = d([np.frombuffer(x, dtype=np.uint8) for x in data], win)
            assert res.images.shape == (len(data), 3, 48, 48) and not res.replaced, res.replaced
        print("OK")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "OK" in proc.stdout, (proc.returncode, proc.stderr[-2000:])


def test_check_image_on_a_memoryview_trims_without_copying_the_rest(corpus):
    c = next(c for c in corpus if c.name == "jpeg_motion_photo_trailer.jpg")
    raw = bytearray(Path(c.path).read_bytes())
    res = check_image(memoryview(raw), LoadOptions(jpeg_mode="keep"))
    assert res.change == "trimmed_trailing_data" and bytes(res.data).endswith(b"\xff\xd9")
    assert jpeg.jpeg_end(bytes(res.data)) == len(res.data)


@pytest.mark.parametrize("policy", ["ignore", "exif"])
def test_whole_image_dali_pipeline_matches_the_cropped_one(accepted, policy, monkeypatch):
    """The pipeline the GPU path builds (whole image decoded, the window cut by resize's ROI,
    decode/dali.py chroma_mode "full") gives the same pixels as the cropped decode, run on DALI's CPU backend."""
    from fastfeed.decode.dali_graph import chroma_mode

    stored = [bytes(r.data) for _, _, r in accepted]
    dims = (np.array([r.width for _, _, r in accepted]), np.array([r.height for _, _, r in accepted]),
            np.array([r.orientation for _, _, r in accepted], dtype=np.uint8))
    flags = np.array([r.pil_only for _, _, r in accepted])
    cropped = _decode_all("cpu-pil", stored, *dims, policy, False, train=True, seed=5, pil=flags)
    monkeypatch.setenv("FASTFEED_DALI_CHROMA", "full")
    assert chroma_mode(gpu=True) == "full"
    full = _decode_all("cpu-dali", stored, *dims, policy, False, train=True, seed=5, pil=flags)
    per_image = np.abs(cropped - full).mean(axis=(1, 2, 3))
    assert per_image.max() < TOL, dict(zip([c.name for c, _, _ in accepted], per_image.round(2)))
    monkeypatch.setenv("FASTFEED_DALI_CHROMA", "sideways")
    with pytest.raises(ValueError, match="FASTFEED_DALI_CHROMA"):
        chroma_mode(gpu=True)


@pytest.mark.parametrize("size", [(4000, 1), (1, 4000), (2, 3000), (5, 1), (3, 7)],
                         ids=["4000x1", "1x4000", "2x3000", "5x1", "3x7"])
@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
@pytest.mark.parametrize("kind", CPU_KINDS)
@pytest.mark.parametrize("policy", ["ignore", "exif"])
def test_a_line_of_pixels_decodes_as_torchvision_resizes_it(size, fmt, kind, policy):
    """Eval's centre crop of a 1-pixel-thin image is a window under a pixel wide, magnified ~300x: each CPU decoder
    samples it where torchvision's Resize + CenterCrop does, with the pixels around the window that PIL's filter
    reads (before: cpu-pil widened the window to a pixel, 8/255 off on noise; cpu-dali decoded only the window's
    pixels, 5/255 off on 2 x 3000, and under policy "exif" took the window for the image's edges, up to 7/255 on a
    5 x 1 PNG)."""
    import io

    from PIL import Image

    w, h = size
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(w).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format=fmt,
                                                                                             quality=95)
    data = buf.getvalue()
    got = _decode_all(kind, [data], np.array([w]), np.array([h]), np.array([1]), policy, True)[0]
    want = reference_eval(data, S, policy).astype(np.int16)
    assert np.abs(got - want).mean() < 0.5


def test_whole_images_route_the_pil_only_samples_to_pil(accepted):
    """The detection GPU path's decode (DaliDecoder.decode_whole), on DALI's CPU backend: every accepted image, a
    `pil_only` one by PIL, comes back whole and as the contract reads it; a record that is no image is reported
    in its place and the rest keep theirs (flagged `pil_only`, it skips the signature check, as a TGA has none, and
    PIL's failure names it)."""
    from fastfeed.decode.dali import DaliDecoder
    from fastfeed.image.contract import contract_image

    stored = [np.frombuffer(bytes(r.data), dtype=np.uint8) for _, _, r in accepted]
    stored.insert(3, np.frombuffer(b"not an image", dtype=np.uint8))
    pil = np.array([r.pil_only for _, _, r in accepted])
    pil = np.insert(pil, 3, True)
    with DaliDecoder(device_id=None, whole_images=True, batch_size=len(stored), num_threads=2) as d:
        got = d.decode_whole(stored, pil)
    assert list(got.bad) == [3] and got.bad[3][0] == "decode_error" and got.offset[3] == -1
    flat = got.flat.numpy()
    for i, data in enumerate(stored):
        if i == 3:
            continue
        w, h = got.size[i]
        img = flat[got.offset[i]:got.offset[i] + w * h * 3].reshape(h, w, 3).astype(np.int16)
        ref = np.asarray(contract_image(bytes(data), "ignore")).astype(np.int16)
        assert img.shape == ref.shape and np.abs(img - ref).mean() < (0.01 if pil[i] else TOL), i


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_routed_sample_that_fails_is_replaced_by_the_batchs_rule(channels_last):
    """DALI's CPU backend with two samples routed to PIL, one of them cut short: under "skip" its slot takes the next
    good position of the batch (a DALI-decoded one: the rule spans both parts), under "raise" it is named; a batch
    that is all routed decodes, one that is all bad raises whatever the policy."""
    import io

    from PIL import Image

    from fastfeed.decode.base import CorruptSampleError
    from fastfeed.decode.dali import DaliDecoder

    def enc(fmt, colour):
        b = io.BytesIO()
        Image.new("RGB", (40, 30), colour).save(b, fmt)
        return np.frombuffer(b.getvalue(), dtype=np.uint8)

    red, tif, blue = enc("JPEG", (200, 10, 10)), enc("TIFF", (10, 200, 10)), enc("JPEG", (10, 10, 200))
    cut = tif[: len(tif) // 3]
    batch, pil = [red, tif, cut, blue], np.array([False, True, True, False])

    def windows(n, flags):
        return crop_windows(np.full(n, 40), np.full(n, 30), np.arange(n), seed=0, epoch=0, train=False,
                            image_size=16, pil=flags)

    with DaliDecoder(device_id=None, batch_size=4, num_threads=2, dtype=torch.uint8, image_size=16,
                     channels_last=channels_last) as d:
        res = d(batch, windows(4, pil))
        means = res.images.float().mean(dim=(2, 3))  # [4, 3] per channel
        assert [(r.position, r.code) for r in res.replaced] == [(2, "decode_error")]
        assert means[1].argmax() == 1 and torch.equal(res.images[2], res.images[3]) and means[3].argmax() == 2
        with pytest.raises(CorruptSampleError):
            d([cut, cut], windows(2, np.array([True, True])))
        assert not d([tif, tif], windows(2, np.array([True, True]))).replaced
    with DaliDecoder(device_id=None, batch_size=4, num_threads=2, dtype=torch.uint8, image_size=16,
                     on_error="raise") as d:
        with pytest.raises(CorruptSampleError) as e:
            d(batch, windows(4, pil))
        assert e.value.positions == [2]
