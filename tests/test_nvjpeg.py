"""Which nvJPEG a process decodes with (decode/nvjpeg.py), and the chroma rule that follows from it (decode/dali.py).

Each case runs in a fresh interpreter: what is mapped depends on what the process imported first."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fastfeed.decode.dali import NVJPEG_ROI_EXACT, chroma_mode
from fastfeed.decode.nvjpeg import mapped_nvjpeg


def _run(code: str) -> dict:
    prelude = ("import json, ctypes\nfrom fastfeed.decode.nvjpeg import mapped_nvjpeg, nvjpeg_version\n"
               "from fastfeed.decode.dali import chroma_mode\n")
    out = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _package_nvjpeg() -> Path:
    """The nvidia-nvjpeg wheel's library (what DALI's decoders open when nothing else is loaded)."""
    import nvidia

    for root in nvidia.__path__:
        for lib in sorted(Path(root).glob("cu*/lib/libnvjpeg.so.*")):
            return lib
    pytest.skip("the nvidia-nvjpeg wheel is not installed")


def test_a_process_that_imported_torchvision_decodes_with_torchvisions_nvjpeg():
    """torchvision loads its bundled nvJPEG at import; DALI's decoders then get that one (same soname). The chroma
    rule follows its version: cropped decodes only from NVJPEG_ROI_EXACT on."""
    got = _run("import torchvision\nv = nvjpeg_version()\n"
               "print(json.dumps({'mapped': mapped_nvjpeg(), 'version': v, 'chroma': chroma_mode(True, v)}))")
    assert len(got["mapped"]) == 1 and "torchvision" in got["mapped"][0], got
    version = tuple(got["version"])
    assert version[0] >= 12
    assert got["chroma"] == ("roi" if version >= NVJPEG_ROI_EXACT else "full")


def test_the_version_read_is_the_librarys_own_and_two_different_libraries_mean_unknown():
    lib = _package_nvjpeg()
    got = _run(f"ctypes.CDLL({str(lib)!r})\none = nvjpeg_version()\nimport torchvision\n"
               "print(json.dumps({'one': one, 'two': nvjpeg_version(), 'mapped': mapped_nvjpeg(), "
               "'chroma_two': chroma_mode(True, nvjpeg_version())}))")
    # The wheel's version, as its name says (nvidia-nvjpeg 13.3.2.43 -> 13.3.2)
    import importlib.metadata as md

    wheel = next((d.version for d in md.distributions() if d.metadata["Name"].startswith("nvidia-nvjpeg")
                  and "2k" not in d.metadata["Name"]), None)
    if wheel is not None:
        assert tuple(got["one"]) == tuple(int(x) for x in wheel.split(".")[:3]), (got, wheel)
    assert len(got["mapped"]) == 2  # torchvision's copy is a second library under the same soname
    assert got["two"] is None and got["chroma_two"] == "full"  # which one a decoder uses is unknown: whole images


def test_nothing_mapped_means_whole_images_and_the_override_still_wins(monkeypatch):
    assert chroma_mode(True, None) == "full"
    assert chroma_mode(True, (13, 1, 9)) == "full"
    assert chroma_mode(True, (13, 2, 0)) == "roi"
    assert chroma_mode(False, None) == "roi"
    monkeypatch.setenv("FASTFEED_DALI_CHROMA", "full")
    assert chroma_mode(True, (13, 3, 2)) == "full"


def test_mapped_nvjpeg_reads_maps_lines(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f0000000000-7f0000001000 r-xp 00000000 08:01 11 /site/torchvision.libs/libnvjpeg.36e11081.so.13\n"
        "7f0000001000-7f0000002000 r--p 00001000 08:01 11 /site/torchvision.libs/libnvjpeg.36e11081.so.13\n"
        "7f0000002000-7f0000003000 r-xp 00000000 08:01 12 /site/nvidia/nvimgcodec/extensions/libnvjpeg_ext.so.0.9.0\n"
        "7f0000003000-7f0000004000 r-xp 00000000 08:01 13 /site/nvidia/nvjpeg2k/lib/libnvjpeg2k.so.0\n"
        "7f0000004000-7f0000005000 rw-p 00000000 00:00 0 \n"
        "7f0000005000-7f0000006000 r-xp 00000000 08:01 14 /site/nvidia/cu13/lib/libnvjpeg.so.13\n")
    assert mapped_nvjpeg(str(maps)) == ["/site/nvidia/cu13/lib/libnvjpeg.so.13",
                                        "/site/torchvision.libs/libnvjpeg.36e11081.so.13"]
    assert mapped_nvjpeg(str(tmp_path / "absent")) == []
