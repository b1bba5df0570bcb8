"""A PNG whose text chunks exceed PIL's safety limits (a zTXt that inflates past PngImagePlugin.MAX_TEXT_CHUNK, here
before and after the pixel data): PIL refuses the file, torchvision and DALI decode it. Text is metadata, so every
fastfeed path decodes the pixels without it: pack stores the file as it is, verify passes, and the CPU decoders give
torchvision's pixels."""
from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
import torch
import torchvision.io as tio
from PIL import Image, PngImagePlugin

import fastfeed
from conftest import run_pack
from fastfeed.image.headers import png_text_over_limit, without_png_text
from fastfeed.pack.verify import verify


def _chunk(kind: bytes, body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")


def big_text_png(seed: int, xmp: bool = False) -> tuple[bytes, np.ndarray]:
    """`xmp`: the text before the pixels is a compressed XMP packet with an orientation in it (a Photoshop export's
    long history), which PIL alone reads the tag from, when it can read the chunk."""
    pixels = np.random.default_rng(seed).integers(0, 255, (40, 56, 3), dtype=np.uint8)
    info = PngImagePlugin.PngInfo()
    if xmp:
        packet = '<x:xmpmeta><tiff:Orientation>6</tiff:Orientation>' + "h" * (2 * PngImagePlugin.MAX_TEXT_CHUNK)
        info.add_itxt("XML:com.adobe.xmp", packet + "</x:xmpmeta>", zip=True)
    else:
        info.add_text("comment", "x" * (2 * PngImagePlugin.MAX_TEXT_CHUNK), zip=True)  # before IDAT
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG", pnginfo=info)
    data = buf.getvalue()
    late = _chunk(b"zTXt", b"late\x00\x00" + zlib.compress(b"y" * (2 * PngImagePlugin.MAX_TEXT_CHUNK)))
    iend = data.rindex(b"IEND") - 4
    return data[:iend] + late + data[iend:], pixels


def test_pil_refuses_it_and_the_pixels_survive_without_the_text():
    data, pixels = big_text_png(0)
    with pytest.raises(ValueError) as info:
        Image.open(io.BytesIO(data)).load()
    assert png_text_over_limit(info.value)
    stripped = without_png_text(data)
    assert len(stripped) < len(data) and b"zTXt" not in stripped
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(stripped)).convert("RGB")), pixels)
    assert np.array_equal(tio.decode_png(torch.frombuffer(bytearray(data), dtype=torch.uint8)).permute(1, 2, 0).numpy(),
                          pixels)
    assert without_png_text(b"not a png") == b"not a png"


@pytest.mark.parametrize("xmp", [False, True], ids=["comment", "xmp"])
@pytest.mark.parametrize("decoder", ["cpu-pil", "cpu-dali"])
def test_pack_verify_and_the_cpu_decoders_take_it(tmp_path, decoder, xmp):
    """The oracle: the same files written without the text, packed and decoded the same way, give the same bytes.
    (An XMP packet past the limit was rejected: pack kept it for PIL, whose reading of the tag it holds disagrees
    with the header parsers', and PIL could not open it.)"""
    for name in ("text", "plain"):
        (tmp_path / name / "a").mkdir(parents=True)
    for i in range(4):
        data, pixels = big_text_png(i, xmp)
        (tmp_path / "text" / "a" / f"{i}.png").write_bytes(data)
        Image.fromarray(pixels).save(tmp_path / "plain" / "a" / f"{i}.png")
    batches = {}
    for name in ("text", "plain"):
        run_pack(tmp_path / name, tmp_path / f"{name}-wds", "--format", "wds")
        # (with its XMP, a file is for the contract's PIL decode on every path: the plain one's oracle is PIL's too)
        kind = "cpu-pil" if xmp and name == "plain" else decoder
        with fastfeed.Loader(tmp_path / f"{name}-wds", batch_size=4, train=False, image_size=32, device="cpu",
                             decoder=kind, dtype=torch.uint8, on_error="raise") as ld:
            (batches[name],) = list(ld)
    ds = fastfeed.open_dataset(tmp_path / "text-wds")
    assert len(ds) == 4 and not ds.manifest.changes  # stored as they are, text included
    for p in range(4):
        assert ds.read(p) == (tmp_path / "text" / str(ds.sources[p])).read_bytes()
    assert verify(str(tmp_path / "text-wds")).ok
    assert torch.equal(batches["text"][0], batches["plain"][0])


def test_a_detection_pack_takes_it_and_its_boxes_are_the_plain_files(tmp_path):
    """YOLO labels are turned into pixels with the image's size, which pack read with PIL for such a file and, PIL
    refusing it, rejected the image ("image size unreadable")."""
    for name in ("text", "plain"):
        (tmp_path / name / "images").mkdir(parents=True)
        (tmp_path / name / "labels").mkdir()
        (tmp_path / name / "data.yaml").write_text("names: [a]\n")
        for i in range(2):
            data, pixels = big_text_png(i, xmp=bool(i))
            if name == "text":
                (tmp_path / name / "images" / f"{i}.png").write_bytes(data)
            else:
                Image.fromarray(pixels).save(tmp_path / name / "images" / f"{i}.png")
            (tmp_path / name / "labels" / f"{i}.txt").write_text("0 0.5 0.5 0.4 0.25\n")
    batches = {}
    for name in ("text", "plain"):
        run_pack(tmp_path / name, tmp_path / f"{name}-wds")
        assert not (tmp_path / f"{name}-wds" / "rejected.jsonl").read_text().strip()
        with fastfeed.Loader(tmp_path / f"{name}-wds", task="detect", batch_size=2, train=False, image_size=64,
                             device="cpu", dtype=torch.uint8, on_error="raise") as ld:
            (batches[name],) = list(ld)
    assert torch.equal(batches["text"]["boxes"], batches["plain"]["boxes"])
    assert torch.equal(batches["text"]["batch_idx"], torch.tensor([0, 1]))
