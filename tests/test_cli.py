"""The `fastfeed` command as a new user meets it: help with no arguments, --version, defaults in every --help."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from fastfeed import __version__
from fastfeed.cli import COMMANDS, _HelpFormatter, _module, main


def test_no_arguments_prints_help_and_succeeds(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fastfeed") and all(name in out for name in COMMANDS)


@pytest.mark.integration
def test_version_in_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "fastfeed.cli", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"fastfeed {__version__}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_shows_its_default(name, capsys):
    p = argparse.ArgumentParser(prog=f"fastfeed {name}", formatter_class=_HelpFormatter)
    _module(name).configure(p)
    text = " ".join(p.format_help().split())  # argparse wraps lines: compare on single spaces
    for action in p._actions:
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
            continue
        assert f"(default: {action.default})" in text, (name, action.option_strings)
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith(f"usage: fastfeed {name}")


def test_bench_names_the_missing_extra_before_measuring(monkeypatch, tmp_path, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    # matplotlib hidden: the run stops at once, naming the extra (the dataset is not even opened)
    assert main(["bench", str(tmp_path), "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "matplotlib not installed" in err and "pip install 'fastfeed[bench]'" in err


@pytest.mark.integration
def test_a_reader_that_goes_away_is_no_error(tmp_path):
    """`fastfeed inspect DIR | head`: the pipe closes under the command's output; it ends quietly with 141 (what a
    shell reports for SIGPIPE), not a traceback."""
    import os

    from conftest import run_pack
    from PIL import Image

    (tmp_path / "src" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "src" / "a" / "0.png")
    run_pack(tmp_path / "src", tmp_path / "out")
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "fastfeed.cli", "inspect", str(tmp_path / "out")], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 141 and "Traceback" not in proc.stderr, proc.stderr


def _pack_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastfeed.cli", "pack", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.integration
def test_pack_refuses_an_out_inside_its_source(tmp_path):
    """A second pack (--overwrite, --resume) would scan the first one's output: an ImageFolder gains OUT as a
    class, its rejected.jsonl lists the old shards."""
    from PIL import Image

    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(src / "a" / "0.png")
    for out in (src / "out", src):
        proc = _pack_cli(src, out, "--quiet")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "is SRC" in proc.stderr and "inside it" in proc.stderr, proc.stderr
    from fastfeed.pack import PackError, PackOptions, pack

    with pytest.raises(PackError, match="inside it"):  # the Python API refuses it the same way
        pack(str(src), str(src / "out"), PackOptions())
    assert sorted(os.listdir(src)) == ["a"]
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for extra in ((), ("--overwrite",)):  # an OUT that is a file: named, and left as it was
        proc = _pack_cli(src, a_file, "--quiet", *extra)
        assert proc.returncode == 2 and f"OUT {a_file} is a file, not a folder" in proc.stderr, proc.stderr
    proc = _pack_cli(src, f"{a_file}/", "--quiet")
    assert proc.returncode == 2 and "is a file, not a folder" in proc.stderr, proc.stderr
    assert a_file.read_text() == "mine"
    nowhere = tmp_path / "dangling"
    nowhere.symlink_to(tmp_path / "missing")
    proc = _pack_cli(src, nowhere, "--quiet")
    assert proc.returncode == 2 and "is a link to nothing, not a folder" in proc.stderr, proc.stderr


def test_a_shard_size_past_any_number_is_refused_in_one_line(tmp_path):
    from PIL import Image

    (tmp_path / "src" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "src" / "a" / "0.png")
    for size in ("1e400", "nan"):
        proc = _pack_cli(tmp_path / "src", tmp_path / "out", "--shard-size", size)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("fastfeed pack: error: ") and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.integration
@pytest.mark.parametrize("option,value", [("--num-parts", "0"), ("--workers", "-1"), ("--max-pixels", "0"),
                                          ("--shuffle-seed", "-1")])
def test_pack_refuses_an_out_of_range_option_before_writing(tmp_path, option, value):
    from PIL import Image

    (tmp_path / "src" / "a").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(tmp_path / "src" / "a" / "0.png")
    proc = _pack_cli(tmp_path / "src", tmp_path / "out", option, value)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"fastfeed pack: error: {option} must be") and proc.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()
