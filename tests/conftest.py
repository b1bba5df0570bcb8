"""Shared session fixtures: one small demo image tree, packed once as WebDataset and once as LMDB by the real CLI.

Everything is built in pytest's tmp_path_factory and reused by every test of the session, so the cost (~3 s) is
paid once. Tests that modify a dataset (missing shard, edited manifest) must work on a copy: `copy_dataset`.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SANITIZE_PREBUILD = pytest.StashKey[tuple]()
DEMO_IMAGES = 160
DEMO_CLASSES = 4
# Small shards so the WebDataset tree has several files (a missing-shard test needs more than one).
DEMO_SHARD_SIZE = "4MB"


def run_pack(src: Path | str, out: Path | str, *args: str) -> subprocess.CompletedProcess:
    """`fastfeed pack SRC OUT ARGS...` through the CLI's own entry point (`fastfeed.cli.main`), in this process: the
    same argument parsing and code a user runs, without an interpreter start per pack (tests of the command as a
    process are in the integration tier: tests/test_cli.py, tests/test_pack.py)."""
    from fastfeed.cli import main

    argv = ["pack", str(src), str(out), "--quiet", *args]
    out_buf, err_buf = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out_buf), contextlib.redirect_stderr(err_buf):
        code = main(argv)
    proc = subprocess.CompletedProcess(["fastfeed", *argv], code, out_buf.getvalue(), err_buf.getvalue())
    if code != 0:
        raise RuntimeError(f"fastfeed {' '.join(argv)} failed ({code}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_pack_interrupted(src, out, *args: str, monkeypatch, after: int) -> None:
    """`run_pack` that dies with RuntimeError("interrupted") as it stores its `after`-th sample: some shards are
    committed, some are not, as when a pack is killed (the journal's resume takes over from there)."""
    import pytest

    from fastfeed.pack import run as pack_run

    real, calls = pack_run._Writer.row, []

    def row(self, *a, **k):
        calls.append(1)
        if len(calls) == after:
            raise RuntimeError("interrupted")
        return real(self, *a, **k)

    monkeypatch.setattr(pack_run._Writer, "row", row)
    with pytest.raises(RuntimeError, match="interrupted"):
        run_pack(src, out, *args)
    monkeypatch.setattr(pack_run._Writer, "row", real)


@pytest.fixture(scope="session")
def pack_cli():
    """The `fastfeed pack` CLI as a function: pack_cli(src, out, *extra_args)."""
    return run_pack


@pytest.fixture(scope="session")
def demo_tree(tmp_path_factory) -> Path:
    """An ImageFolder tree of DEMO_IMAGES real JPEGs (300-600 px, ~110 KB each) in DEMO_CLASSES classes."""
    from fastfeed.demo_data import make_dataset

    return make_dataset(tmp_path_factory.mktemp("demo") / "src", num_images=DEMO_IMAGES,
                        num_classes=DEMO_CLASSES, seed=0, workers=1)


@pytest.fixture(scope="session")
def packed(demo_tree, tmp_path_factory) -> dict[str, Path]:
    """{"wds": folder, "lmdb": folder}: `demo_tree` packed by the CLI with the same shuffle seed."""
    root = tmp_path_factory.mktemp("packed")
    out = {"wds": root / "wds", "lmdb": root / "lmdb"}
    run_pack(demo_tree, out["wds"], "--format", "wds", "--shard-size", DEMO_SHARD_SIZE)
    run_pack(demo_tree, out["lmdb"], "--format", "lmdb")
    return out


@pytest.fixture(scope="session")
def wds_path(packed) -> Path:
    return packed["wds"]


@pytest.fixture(scope="session")
def lmdb_path(packed) -> Path:
    return packed["lmdb"]


@pytest.fixture
def copy_dataset(tmp_path):
    """copy_dataset(folder) -> a private copy a test may damage. Data files are hard links (no bytes copied), so
    a test must replace files (unlink, write new) and never modify one in place."""

    def copy(src: Path) -> Path:
        dst = tmp_path / f"copy-{Path(src).name}"
        shutil.copytree(src, dst, copy_function=os.link)
        return dst

    return copy


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA and DALI's GPU backend: they run on a GPU machine (`pytest -m gpu`) and are skipped,
    with the reason here, on machines without a GPU, such as CI."""
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine: pytest -m gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session):
    """A selected `sanitize` test needs an ASan build of the native core (~30 s on 2 cores): start it now, at low
    priority, so that it overlaps the tests before it (tests/test_ring_sanitize.py waits for it)."""
    if not any("sanitize" in item.keywords for item in session.items) or shutil.which("gcc") is None:
        return
    folder = tempfile.mkdtemp(prefix="fastfeed-sanitize-build-")
    env = dict(os.environ, SANITIZE_BUILD_DIR=folder, SANITIZE_BUILD_ONLY="1", PYTHON=sys.executable)
    env.pop("FASTFEED_RING_SANITIZE", None)
    log = open(os.path.join(folder, "prebuild.log"), "w")
    proc = subprocess.Popen(["nice", "-n", "19", "bash", str(ROOT / "tools" / "sanitize.sh"), "address"], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    session.config.stash[SANITIZE_PREBUILD] = (proc, folder, log)


def pytest_sessionfinish(session):
    prebuild = session.config.stash.get(SANITIZE_PREBUILD, None)
    if prebuild is not None:
        proc, folder, log = prebuild
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def sanitize_build(request) -> str | None:
    """The folder of the ASan build started at collection (None when it was not started or failed: the test then
    builds its own)."""
    prebuild = request.config.stash.get(SANITIZE_PREBUILD, None)
    if prebuild is None:
        return None
    proc, folder, _ = prebuild
    return folder if proc.wait() == 0 else None
