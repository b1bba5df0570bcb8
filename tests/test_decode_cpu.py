"""Both CPU decoders (cpu-pil, cpu-dali) on real JPEG/PNG records made from scikit-image photos."""
import io

import numpy as np
import pytest
import skimage.data
import torch
from PIL import Image

from fastfeed import IMAGENET_MEAN, IMAGENET_STD
from fastfeed.decode import CorruptSampleError, crop_windows, make_decoder
from decode_samples import colour_variants, corrupt_variants, torchvision_eval_reference

S = 64  # small output keeps the suite fast; the transform is size-independent
KINDS = ["cpu-pil", "cpu-dali"]
STD = torch.tensor(IMAGENET_STD).view(3, 1, 1)


def _photos():
    out = {}
    for name in ("astronaut", "coffee", "chelsea", "rocket"):
        rgb = getattr(skimage.data, name)()
        out[name] = rgb
    # A large, non-square one, so eval windows are far from whole pixels and resizing is strongly downscaling.
    big = Image.fromarray(skimage.data.coffee()).resize((1333, 889), Image.BICUBIC)
    out["coffee_big"] = np.asarray(big)
    return out


PHOTOS = _photos()
VARIANTS = {name: colour_variants(rgb) for name, rgb in PHOTOS.items()}


def _arr(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype=np.uint8)


def _size(b: bytes):
    return Image.open(io.BytesIO(b)).size


def _windows(records, train, seed=0):
    sizes = [_size(r) for r in records]
    return crop_windows([s[0] for s in sizes], [s[1] for s in sizes], np.arange(len(records)), seed=seed,
                        epoch=0, train=train, image_size=S)


@pytest.fixture(scope="module", params=KINDS)
def dec32(request):
    d = make_decoder(request.param, device="cpu", image_size=S, dtype=torch.float32, batch_size=16, num_threads=2)
    yield d
    d.close()


@pytest.mark.parametrize("photo", list(PHOTOS))
def test_eval_matches_torchvision_reference(dec32, photo):
    records = [VARIANTS[photo]["jpeg_baseline"], VARIANTS[photo]["jpeg_progressive"]]
    res = dec32([_arr(r) for r in records], _windows(records, train=False))
    assert res.images.shape == (2, 3, S, S) and res.images.dtype == torch.float32 and not res.replaced
    for i, r in enumerate(records):
        ref = torchvision_eval_reference(r, S, IMAGENET_MEAN, IMAGENET_STD)
        diff = float(((res.images[i] - ref).abs() * STD).mean())  # in [0, 1] pixel units
        assert diff < 2 / 255, (photo, i, diff * 255)


def test_all_colour_modes_come_out_rgb(dec32):
    variants = VARIANTS["chelsea"]
    names = list(variants)
    records = [variants[n] for n in names]
    res = dec32([_arr(r) for r in records], _windows(records, train=False))
    assert res.images.shape == (len(names), 3, S, S) and not res.replaced
    pix = res.images * STD + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)  # back to [0, 1]
    colour = pix[names.index("jpeg_baseline")]
    gray = pix[names.index("png_gray")]
    for i, n in enumerate(names):
        expect = gray if "gray" in n else colour
        diff = float((pix[i] - expect).abs().mean())
        tol = 6 / 255 if n in ("png_palette", "jpeg_cmyk") else 3 / 255  # 256-colour palette; CMYK round-trip
        assert diff < tol, (n, diff * 255)
        if "gray" in n:
            assert float((pix[i][0] - pix[i][1]).abs().max()) < 1e-6  # replicated to 3 equal channels


def test_train_flip_mirrors_the_same_crop(dec32):
    rec = VARIANTS["astronaut"]["png_rgb"]
    w = _windows([rec, rec], train=True)
    w = type(w)(w.x[[0, 0]], w.y[[0, 0]], w.w[[0, 0]], w.h[[0, 0]], np.array([False, True]))
    res = dec32([_arr(rec), _arr(rec)], w)
    torch.testing.assert_close(res.images[1], res.images[0].flip(-1), atol=1e-6, rtol=0)


def test_train_output_is_deterministic(dec32):
    recs = [VARIANTS[p]["jpeg_baseline"] for p in ("coffee", "rocket", "chelsea")]
    a = dec32([_arr(r) for r in recs], _windows(recs, train=True, seed=5)).images
    b = dec32([_arr(r) for r in recs], _windows(recs, train=True, seed=5)).images
    c = dec32([_arr(r) for r in recs], _windows(recs, train=True, seed=6)).images
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("kind", KINDS)
def test_corrupt_records_skip_and_raise(kind):
    good = VARIANTS["coffee"]["jpeg_baseline"]
    bad = corrupt_variants(good)
    records = [good, bad["text"], VARIANTS["rocket"]["png_rgb"], bad["truncated_jpeg"], bad["empty"]]
    sizes = [(600, 400), (600, 400), _size(records[2]), (600, 400), (600, 400)]
    w = crop_windows([s[0] for s in sizes], [s[1] for s in sizes], np.arange(5), seed=0, epoch=0, train=False,
                     image_size=S)
    arrs = [_arr(r) for r in records]
    with make_decoder(kind, device="cpu", image_size=S, dtype=torch.float32, batch_size=8, num_threads=2) as d:
        res = d(arrs, w)
        assert res.images.shape == (5, 3, S, S)
        # Structured reasons, the same codes on every decoder: no signature -> not_image, else decode_error.
        assert [(r.position, r.code) for r in res.replaced] == [(1, "not_image"), (3, "decode_error"),
                                                                (4, "not_image")]
        assert all(r.detail for r in res.replaced)
        # Replacement = a copy of the next good sample; good samples are untouched.
        assert torch.equal(res.images[1], res.images[2]) and torch.equal(res.images[4], res.images[0])
        ok = d([arrs[0], arrs[2]], w.take([0, 2])).images
        assert torch.equal(ok[0], res.images[0]) and torch.equal(ok[1], res.images[2])
    with make_decoder(kind, device="cpu", image_size=S, dtype=torch.float32, batch_size=8, num_threads=2,
                      on_error="raise") as d:
        with pytest.raises(CorruptSampleError) as ei:
            d(arrs, w)
        assert ei.value.position == 1 and ei.value.positions == [1, 3, 4]
        assert ei.value.codes == ["not_image", "decode_error", "not_image"]
        with pytest.raises(CorruptSampleError):  # nothing good to copy from, whatever the policy
            d([arrs[1]], w.take([1]))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.uint8])
def test_dtypes_and_channels_last(kind, dtype):
    recs = [VARIANTS["coffee"]["jpeg_baseline"], VARIANTS["rocket"]["jpeg_baseline"]]
    w = _windows(recs, train=True)
    with make_decoder(kind, device="cpu", image_size=S, dtype=torch.float32, batch_size=4, num_threads=1) as d:
        ref = d([_arr(r) for r in recs], w).images
    for cl in (False, True):
        with make_decoder(kind, device="cpu", image_size=S, dtype=dtype, channels_last=cl, batch_size=4,
                          num_threads=1) as d:
            out = d([_arr(r) for r in recs], w).images
        assert out.dtype == dtype and out.shape == (2, 3, S, S)
        assert out.is_contiguous(memory_format=torch.channels_last if cl else torch.contiguous_format)
        if dtype == torch.uint8:
            expect = ((ref * STD + torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) * 255).round()
            assert float((out.float() - expect).abs().max()) <= 1.0
        else:
            assert float((out.float() - ref).abs().max()) < 0.02


def test_make_decoder_rejects_bad_arguments():
    with pytest.raises(ValueError):
        make_decoder("nope", device="cpu")
    with pytest.raises(ValueError):
        make_decoder("cpu-pil", device="cpu", dtype=torch.int32)
    with pytest.raises(ValueError):
        make_decoder("cpu-pil", device="cpu", on_error="ignore")
    with pytest.raises(ValueError):
        make_decoder("dali", device="cpu")


@pytest.mark.parametrize("channels_last", [False, True])
def test_cpu_decoder_recycles_output_memory_only_after_release(demo_tree, channels_last):
    """The CPU decoder reuses output memory (fresh pages cost 4x in the kernel); a batch anyone still holds, or
    holds a view of, must never be overwritten."""
    files = sorted(demo_tree.rglob("*.jpg"))[:16]
    data = [np.fromfile(p, dtype=np.uint8) for p in files]
    sizes = []
    for p in files:
        with Image.open(p) as im:
            sizes.append(im.size)
    W, H = np.array([s[0] for s in sizes]), np.array([s[1] for s in sizes])

    def batch(k):
        ids = np.arange(4 * k, 4 * k + 4) % len(data)
        win = crop_windows(W[ids], H[ids], ids, seed=0, epoch=k, train=True, image_size=32)
        return [data[i] for i in ids], win

    dec = make_decoder("cpu-pil", device="cpu", image_size=32, batch_size=4, dtype=torch.float32,
                       channels_last=channels_last, num_threads=2)
    try:
        held = dec(*batch(0)).images
        view = dec(*batch(1)).images[1:3]  # only a view of batch 1 survives
        held_copy, view_copy = held.clone(), view.clone()
        ptrs = set()
        for k in range(2, 12):
            out = dec(*batch(k)).images
            ptrs.add(out.untyped_storage().data_ptr())
            del out
        assert torch.equal(held, held_copy) and torch.equal(view, view_copy)
        assert held.untyped_storage().data_ptr() not in ptrs
        assert view.untyped_storage().data_ptr() not in ptrs
        assert len(ptrs) == 1  # released batches are written into the same memory again
    finally:
        dec.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.uint8])
@pytest.mark.parametrize("channels_last", [False, True])
def test_normalising_after_the_copy_gives_the_cpu_paths_bits(dtype, channels_last):
    """The split path (decode/split.py: uint8 from the CPU decoder, table lookup where the batch goes) against the
    CPU path normalising before the copy: the same bits, every dtype and layout. Run here on the CPU device; on a
    GPU the same lookup runs there (tests/test_gpu.py)."""
    from fastfeed.decode.dali import DaliDecoder
    from fastfeed.decode.split import NormalizeOnDevice

    records = [VARIANTS[p][v] for p in ("astronaut", "coffee_big") for v in ("jpeg_baseline", "png_rgb")]
    windows = _windows(records, train=True, seed=3)
    samples = [_arr(r) for r in records]
    kw = dict(device_id=None, image_size=S, batch_size=8, num_threads=2)
    with DaliDecoder(dtype=dtype, channels_last=channels_last, **kw) as whole, \
            DaliDecoder(dtype=torch.uint8, channels_last=True, **kw) as inner:
        want = whole(samples, windows).images
        split = NormalizeOnDevice(inner, "cpu", dtype=dtype, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                                  channels_last=channels_last)
        got = split(samples, windows).images
    assert got.dtype == want.dtype == dtype and got.shape == want.shape == (4, 3, S, S)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert got.is_contiguous(memory_format=fmt)
    assert torch.equal(got.view(torch.uint8) if dtype == torch.uint8 else got, want)


def _jpeg(rgb, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


def _decode_both(monkeypatch, record, box, size=224, draft=2.0):
    """decode/cpu.py's decode_rgb with the window decode, and with it off (the whole image decoded by PIL)."""
    import fastfeed.decode.cpu as C

    new = C.decode_rgb(record, box, size, draft)
    with monkeypatch.context() as m:
        m.setattr(C, "_REGION_DECODE", None)
        old = C.decode_rgb(record, box, size, draft)
    return new, old


def _counting_region_decode(monkeypatch):
    import fastfeed.decode.cpu as C

    calls = []
    inner = C._REGION_DECODE
    assert inner is not None, "the native core was built without libjpeg"
    monkeypatch.setattr(C, "_REGION_DECODE", lambda *a: (calls.append(a), inner(*a))[1])
    return calls


@pytest.mark.parametrize("subsampling,progressive,grey", [(0, False, False), (1, False, False), (2, False, False),
                                                          (2, True, False), (-1, False, True)])
def test_training_crops_decode_only_their_window_to_the_same_bits(monkeypatch, subsampling, progressive, grey):
    """A training crop of an RGB or grey JPEG decodes only the rows and columns its resize reads (decode/cpu.py
    _resized_region, the native window decode): the output is the whole-image decode's (PIL's, grey converted to
    RGB), bit for bit, for 4:4:4, 4:2:2, 4:2:0, progressive and greyscale JPEGs, at odd sizes (partial iMCUs),
    windows at every edge included."""
    rgb = np.asarray(Image.fromarray(PHOTOS["coffee_big"]).resize((1001, 667), Image.BICUBIC))
    record = _arr(_jpeg(rgb[..., 1], progressive=progressive) if grey
                  else _jpeg(rgb, subsampling=subsampling, progressive=progressive))
    windows = crop_windows([1001] * 48, [667] * 48, np.arange(48), seed=subsampling, epoch=0, train=True,
                           image_size=224)
    boxes = windows.box.tolist() + [[0, 0, 1001, 667], [0, 600, 40, 667], [960, 0, 1001, 30]]
    calls = _counting_region_decode(monkeypatch)
    for box in boxes:
        new, old = _decode_both(monkeypatch, record, box)
        assert np.array_equal(new, old), box
    assert len(calls) == len(boxes)
    assert any(c[3] - c[1] < 600 for c in calls)  # most windows are a part of the image


def test_what_a_window_decode_cannot_take_is_decoded_whole(monkeypatch):
    """CMYK JPEGs, EXIF-rotated ones under orientation "exif", fractional (eval) boxes and records without their
    end-of-image marker never take the window decode; a record cut short still raises (PIL's full decode reports
    it), as before."""
    import fastfeed.decode.cpu as C

    rgb = PHOTOS["astronaut"]
    calls = _counting_region_decode(monkeypatch)
    cmyk_buf = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(cmyk_buf, "JPEG", quality=90)
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated = _arr(_jpeg(rgb, exif=exif.tobytes()))
    plain = _jpeg(rgb)
    trailing = _arr(plain + b"\0\0")
    for record, box, orient in ((_arr(cmyk_buf.getvalue()), [10, 20, 300, 310], "ignore"),
                                (rotated, [10, 20, 300, 310], "exif"),
                                (_arr(plain), [10.5, 20.25, 300.5, 310.75], "ignore"), (trailing, [10, 20, 300, 310],
                                                                                       "ignore")):
        out = C.decode_rgb(record, box, 224, 2.0, orient)
        assert out.shape == (224, 224, 3)
    assert calls == []
    with pytest.raises(OSError):
        C.decode_rgb(_arr(plain[: len(plain) // 2]), [10, 20, 100, 110], 224, 2.0)
    assert calls == []
    assert len(C.decode_rgb(_arr(plain), [10, 20, 100, 110], 224, 2.0)) == 224 and len(calls) == 1
