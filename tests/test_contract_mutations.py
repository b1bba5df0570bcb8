"""Pack's decision against the decoders on damaged files: JPEGs and PNGs with a few bytes changed (in the header or
anywhere), seeded. Whatever pack stores for every decoder must decode to the same pixels with PIL (the decode
contract's reference) and DALI's CPU decoder; whatever it stores for PIL alone PIL must decode; and nothing PIL
decodes may be rejected. Each kind of disagreement this found once is a rule in pack/validate.py now."""
from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from PIL import Image

from fastfeed.pack.validate import Loaded, LoadOptions, check_image
from odd_images.build import photo

pytest.importorskip("nvidia.dali")


def _dali_decoder():
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=1, num_threads=1, device_id=None, prefetch_queue_depth=1, exec_pipelined=False,
                  exec_async=False)
    def pipe():
        return fn.decoders.image(fn.external_source(name="x", dtype=types.UINT8), device="cpu",
                                 output_type=types.RGB)

    state = {}

    def decode(data: bytes):
        if "p" not in state:
            state["p"] = pipe()
            state["p"].build()
        try:
            state["p"].feed_input("x", [np.frombuffer(data, np.uint8)])
            return state["p"].run()[0].as_array()[0]
        except Exception:  # noqa: BLE001 - a refusal; the pipeline is not usable after one
            state.pop("p")
            return None
    return decode


def _pil(data: bytes):
    try:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))
    except Exception:  # noqa: BLE001 - a refusal
        return None


def _bases() -> dict:
    im = Image.fromarray(photo(96, 64), "RGB")
    out = {"jpeg": [], "png": []}
    for kw in ({}, {"subsampling": 0}, {"progressive": True}, {"restart_marker_blocks": 2}):
        out["jpeg"].append(_save(im, "JPEG", quality=90, **kw))
    out["jpeg"].append(_save(im.convert("L"), "JPEG", quality=80))
    out["png"] += [_save(im, "PNG"), _save(im.convert("L"), "PNG"),
                   _save(im.convert("P", palette=Image.ADAPTIVE, colors=64), "PNG")]
    return out


def _save(im, fmt, **kw) -> bytes:
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


@pytest.mark.parametrize("seed", [0, 1])
def test_what_pack_stores_decodes_alike_and_nothing_pil_reads_is_refused(seed):
    bases, dali = _bases(), _dali_decoder()
    rng = np.random.default_rng(seed)
    problems, stored = [], {"all": 0, "pil": 0, "rejected": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for trial in range(600):
            kind = ("jpeg", "png")[trial % 2]
            data = bytearray(bases[kind][int(rng.integers(len(bases[kind])))])
            for _ in range(int(rng.integers(1, 4))):
                end = min(len(data), 700) if rng.random() < 0.5 else len(data)  # the header, or anywhere
                data[int(rng.integers(2, end))] = int(rng.integers(256))
            data = bytes(data)
            got = check_image(data, LoadOptions())
            if not isinstance(got, Loaded):
                stored["rejected"] += 1
                if _pil(data) is not None:
                    problems.append((trial, kind, "rejected though PIL decodes it", got.reason))
                continue
            kept = bytes(got.data)
            ref = _pil(kept)
            if got.pil_only:
                stored["pil"] += 1
                if ref is None:
                    problems.append((trial, kind, "stored for PIL, which refuses it", got.change))
                continue
            stored["all"] += 1
            out = dali(kept)
            if ref is None or out is None or out.shape != ref.shape or np.abs(out.astype(int) - ref).mean() >= 2:
                problems.append((trial, kind, "stored for every decoder, which disagree",
                                 "PIL refuses" if ref is None else "DALI refuses" if out is None else "pixels"))
    assert not problems, problems[:5]
    assert min(stored.values()) > 20, stored  # every branch was taken often
