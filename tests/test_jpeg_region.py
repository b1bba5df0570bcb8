"""The native window decode (csrc/jpeg_transcode.h decode_jpeg_region) the CPU decoder's training crops use: the
pixels of a window of a JPEG without decoding the rest."""
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import skimage.data
from PIL import Image

from fastfeed import _native

pytestmark = pytest.mark.skipif(not _native.HAVE_LIBJPEG, reason="the native core was built without libjpeg")


def _jpeg(rgb, **save) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


PHOTO = np.asarray(Image.fromarray(skimage.data.chelsea()).resize((437, 301), Image.BICUBIC))


@pytest.mark.parametrize("subsampling", [0, 1, 2, "grey"])
def test_a_window_holds_the_full_decodes_pixels_but_its_outer_columns(subsampling):
    """Rows are exact; columns widen to whole iMCUs (x <= x0, the window inside), and only the first and last
    column of a cropped decode may differ from the full decode's (upsampled without their outer neighbours) unless
    they are the image's own edges. Pixels come as RGBX (PIL's layout for RGB); a grey JPEG's as PIL converts L to
    RGB (R = G = B), every column exact (one component: nothing upsampled)."""
    grey = subsampling == "grey"
    data = _jpeg(PHOTO[..., 1]) if grey else _jpeg(PHOTO, subsampling=subsampling)
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    for x0, y0, x1, y1 in [(100, 50, 300, 260), (0, 0, 437, 301), (3, 7, 20, 9), (400, 280, 437, 301), (-5, -5, 9, 9)]:
        got = _native.decode_jpeg_region(data, x0, y0, x1, y1)
        assert not isinstance(got, str), got
        rgbx, x, y, W, H = got
        assert (W, H) == (437, 301) and rgbx.dtype == np.uint8 and rgbx.flags.c_contiguous and rgbx.shape[2] == 4
        pixels = rgbx[:, :, :3]
        h, w = pixels.shape[:2]
        assert x <= max(x0, 0) and x + w >= min(x1, W) and y == max(y0, 0) and y + h == min(y1, H)
        ref = full[y:y + h, x:x + w]
        inner = slice(None) if grey else slice(0 if x == 0 else 1, w if x + w == W else w - 1)
        assert np.array_equal(pixels[:, inner], ref[:, inner]), (x0, y0, x1, y1)
        assert np.abs(pixels.astype(int) - ref).max() <= 8


def test_what_it_refuses_comes_back_as_a_reason():
    """A str, never an exception or a crash: not a JPEG, a CMYK one (the caller decodes it whole), a cut-off record,
    an empty window."""
    data = _jpeg(PHOTO)
    cmyk = io.BytesIO()
    Image.fromarray(PHOTO).convert("CMYK").save(cmyk, "JPEG")
    cases = {b"not a jpeg": "Not a JPEG", b"": "empty", cmyk.getvalue(): "greyscale JPEG",
             data[: len(data) // 3]: "", data: "empty window"}
    for record, reason in cases.items():
        box = (50, 50, 50, 60) if record is data else (0, 0, 437, 301)
        got = _native.decode_jpeg_region(record, *box)
        assert isinstance(got, str) and reason in got, (reason, got)


def test_many_threads_decode_windows_at_once():
    """The GIL is released while it decodes; each call owns its libjpeg objects (the sanitizer run checks it)."""
    data = _jpeg(PHOTO)
    boxes = [(i % 200, i % 150, i % 200 + 200, i % 150 + 150) for i in range(64)]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda b: _native.decode_jpeg_region(data, *b), boxes))
    for b, o in zip(boxes, outs):
        assert np.array_equal(o[0], _native.decode_jpeg_region(data, *b)[0])


def test_pixels_go_into_the_callers_buffer_when_they_fit():
    """`out` recycles memory (fresh pages fault on first write): the pixels, from its start, in a view of it when they
    fit, every byte written (the pad byte too); memory of their own when they do not, `out` left untouched; a
    read-only buffer is refused. Threads decoding into one buffer's disjoint parts at once (the detection decoder's
    arena) each get their own pixels."""
    data = _jpeg(PHOTO)
    alone = _native.decode_jpeg_region(data, 0, 0, 437, 301)[0]
    out = np.full(alone.nbytes + 64, 7, np.uint8)
    got, x, y, W, H = _native.decode_jpeg_region(data, 0, 0, 437, 301, out=out)
    assert np.shares_memory(got, out) and got.ctypes.data == out.ctypes.data and (x, y, W, H) == (0, 0, 437, 301)
    assert np.array_equal(got, alone) and (out[alone.nbytes:] == 7).all() and (got[..., 3] == 255).all()
    window = _native.decode_jpeg_region(data, 100, 50, 300, 260, out=out)[0]
    assert np.shares_memory(window, out)
    assert np.array_equal(window, _native.decode_jpeg_region(data, 100, 50, 300, 260)[0])
    small = np.full(alone.nbytes - 1, 7, np.uint8)
    got = _native.decode_jpeg_region(data, 0, 0, 437, 301, out=small)[0]
    assert not np.shares_memory(got, small) and np.array_equal(got, alone) and (small == 7).all()
    with pytest.raises(BufferError):
        _native.decode_jpeg_region(data, 0, 0, 437, 301, out=bytes(alone.nbytes))
    resizable = bytearray(alone.nbytes)
    held = _native.decode_jpeg_region(data, 0, 0, 437, 301, out=resizable)[0]
    with pytest.raises(BufferError):  # the array holds an export of it: its memory cannot move under the pixels
        resizable.extend(bytes(1 << 20))
    assert np.array_equal(held, alone)
    del held
    resizable.extend(b"x")
    records = [_jpeg(np.roll(PHOTO, 7 * i, axis=1)) for i in range(16)]
    arena = np.empty(16 * alone.nbytes, np.uint8)
    parts = [arena[i * alone.nbytes:(i + 1) * alone.nbytes] for i in range(16)]
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda i: _native.decode_jpeg_region(records[i], 0, 0, 437, 301, out=parts[i])[0],
                             range(16)))
    for i, o in enumerate(outs):
        assert np.shares_memory(o, parts[i])
        assert np.array_equal(o, _native.decode_jpeg_region(records[i], 0, 0, 437, 301)[0])


@pytest.mark.parametrize("subsampling", [0, 2, "grey"])
def test_a_dct_scaled_decode_is_pils_draft_to_the_bit(subsampling):
    """scale 2, 4, 8: libjpeg's scaled decode, as PIL's draft asks it (the detection path's drafts): PIL's pixels to
    the bit (a grey JPEG's converted to RGB), the full image's size returned, a window in the scaled image's pixels;
    another scale is refused."""
    data = _jpeg(PHOTO[..., 1], progressive=True) if subsampling == "grey" else _jpeg(PHOTO, subsampling=subsampling)
    for scale in (1, 2, 4, 8):
        with Image.open(io.BytesIO(data)) as im:
            im.draft("RGB", (437 // scale, 301 // scale))
            want = np.asarray(im.convert("RGB"))
        rgbx, x, y, W, H = _native.decode_jpeg_region(data, 0, 0, 437, 301, scale=scale)
        assert (W, H) == (437, 301) and rgbx.shape[:2] == (-(-301 // scale), -(-437 // scale)) == want.shape[:2]
        assert np.array_equal(rgbx[..., :3], want), scale
        window = _native.decode_jpeg_region(data, 0, 10, 437, 20, scale=scale)[0]
        assert np.array_equal(window[..., :3], want[10:20]), scale
    assert "scale_denom" in _native.decode_jpeg_region(data, 0, 0, 437, 301, scale=3)


def test_the_draft_scale_is_the_one_pils_draft_picks():
    """render.draft_denominator, which sizes the detection path's recycled buffer and asks the native decode for
    PIL's scale, against what PIL's draft itself does for the same request."""
    from fastfeed.detect.render import draft_denominator

    data = _jpeg(PHOTO)
    for want in [(437, 301), (300, 200), (218, 150), (200, 160), (109, 75), (60, 40), (54, 37), (20, 20), (1, 1),
                 (500, 400), (437, 1)]:
        with Image.open(io.BytesIO(data)) as im:
            got = im.draft("RGB", want)
            assert draft_denominator((437, 301), want) == round(437 / got[1][2]), want
    assert draft_denominator((437, 301), None) == 1
