"""`fastfeed pack --format wds` through the native tar writer (pack/wds_native.py) writes the very same files as the
Python writer (pack/wds.py): the same tree packed both ways, every output file compared byte for byte, on the
odd-image corpus (trimmed, converted, transcoded, rejected files) plus real demo JPEGs, with shard sizes small
enough that many shards end mid-call; and the `checksum` column is the xxh3 of the bytes stored in the tar."""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import xxhash

from fastfeed.pack.native import HAVE_NATIVE_WRITER
from odd_images.tree import build_mixed_tree

pytestmark = [pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning"),
              pytest.mark.skipif(not HAVE_NATIVE_WRITER, reason="native core built without the tar writer")]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = build_mixed_tree(tmp_path_factory.mktemp("wired") / "src", seed=1)
    os.mkfifo(root / "odd" / "fifo.jpg")  # rejected from its stat, never opened
    return root


def _pack(src: Path, out: Path, native: bool, *args: str) -> None:
    env = dict(os.environ, FASTFEED_PACK_NATIVE="1" if native else "0")
    cmd = [sys.executable, "-m", "fastfeed.cli", "pack", str(src), str(out), "--quiet", "--format", "wds", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.integration  # the CLI as a process
@pytest.mark.parametrize("args", [(), ("--shard-size", "300KB"), ("--shard-size", "64KB", "--jpeg", "keep"),
                                  ("--no-shuffle", "--shard-size", "1MB", "--max-side", "200", "--workers", "1")])
def test_native_and_python_writers_write_identical_files(tree, tmp_path, args):
    _pack(tree, tmp_path / "py", False, *args)
    _pack(tree, tmp_path / "native", True, *args)
    py, nat = _files(tmp_path / "py"), _files(tmp_path / "native")
    assert sorted(py) == sorted(nat)
    assert sum(n.endswith(".tar") for n in py) >= (2 if args else 1)
    for name in py:
        assert py[name] == nat[name], f"{name} differs between the Python and the native writer"
    _check_checksums(tmp_path / "native")


def _check_checksums(folder: Path) -> None:
    """Every row's checksum is xxh3_64 of the image bytes in its shard; trimmed and `pil_only` rows included."""
    with np.load(folder / "samples.npz") as z:
        t = {k: z[k] for k in z.files}
    assert "trimmed_trailing_data" in set(t["change"].tolist()) and t["pil_only"].any()
    shards = sorted(folder.glob("shard-*.tar"))
    for i in range(len(t["key"])):
        with open(shards[int(t["shard"][i])], "rb") as f:
            f.seek(int(t["offset"][i]))
            data = f.read(int(t["size"][i]))
        assert xxhash.xxh3_64_intdigest(data) == int(t["checksum"][i]), t["source"][i]
    # and the tars are plain tars a stock reader lists in the same order as the table
    names = []
    for s in shards:
        with tarfile.open(s) as tf:
            names += [m.name.split(".")[0] for m in tf.getmembers() if not m.name.endswith((".cls", ".json"))]
    assert names == [str(k) for k in t["key"]]


@pytest.mark.integration  # the CLI as a process
def test_parts_and_merge_identical(tree, tmp_path):
    for native in (False, True):
        out = tmp_path / ("native" if native else "py")
        for part in ("0", "1"):
            _pack(tree, out, native, "--num-parts", "2", "--part", part, "--shard-size", "500KB")
        env = dict(os.environ, FASTFEED_PACK_NATIVE="1" if native else "0")
        subprocess.run([sys.executable, "-m", "fastfeed.cli", "merge", str(out)], check=True, env=env,
                       capture_output=True)
    py, nat = _files(tmp_path / "py"), _files(tmp_path / "native")
    assert sorted(py) == sorted(nat) and all(py[n] == nat[n] for n in py)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("first_native", [True, False])
def test_interrupted_pack_resumed_by_the_other_writer(tree, tmp_path, monkeypatch, first_native):
    """Both writers journal the same commits: a pack stopped mid-way by one is finished by the other, and the
    result is the uninterrupted pack's, byte for byte."""
    from dataclasses import replace

    from fastfeed.pack import PackOptions, pack, reader, wds_native

    o = PackOptions(format="wds", shard_size=300_000)
    monkeypatch.setattr(wds_native, "ENABLED", False)
    pack(str(tree), str(tmp_path / "whole"), o)

    module = wds_native if first_native else reader  # where the first writer calls the validator
    real, calls = module.check_image, [0]

    def stopping(data, opts, *facts, **name):  # the native path also passes the reader threads' facts
        calls[0] += 1
        if calls[0] > 40:
            raise _Stop()
        return real(data, opts, *facts, **name)

    monkeypatch.setattr(wds_native, "ENABLED", first_native)
    monkeypatch.setattr(module, "check_image", stopping)
    out = tmp_path / "resumed"
    with pytest.raises(_Stop):
        pack(str(tree), str(out), o)
    assert any(n.startswith("shard-") and n.endswith(".tar") for n in os.listdir(out))  # some shards committed
    monkeypatch.setattr(module, "check_image", real)
    monkeypatch.setattr(wds_native, "ENABLED", not first_native)
    pack(str(tree), str(out), replace(o, resume=True))
    whole, resumed = _files(tmp_path / "whole"), _files(out)
    assert sorted(whole) == sorted(resumed) and all(whole[n] == resumed[n] for n in whole)
