"""The install path README's two commands take: the native core is rebuilt only when csrc/ changes, and `PIL` is
provided by exactly one package after `make setup` (pillow-simd, or Pillow when it could not build)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.integration  # a Python and a make process


def test_pil_check_names_the_package_that_provides_pil():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "check_pil.py")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    import PIL

    assert proc.stdout.startswith(f"PIL {PIL.__version__} from ")
    assert proc.stdout.split(" from ")[1].split()[0] in ("pillow-simd", "Pillow")


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_builds_the_native_core_only_when_csrc_changed(tmp_path):
    for name in ("Makefile", "setup.py", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "csrc", tmp_path / "csrc")
    (tmp_path / "fastfeed").mkdir()
    (tmp_path / ".venv").mkdir()
    native = tmp_path / "fastfeed" / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"

    def plan() -> str:  # what `make build` would run (-n: print, do not run)
        return subprocess.run(["make", "-n", "build", f"PY={sys.executable}"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, check=True).stdout

    def touch(path: Path, t: float) -> None:
        path.touch()
        os.utime(path, (t, t))

    t = 1_700_000_000
    for p in [*(tmp_path / "csrc").iterdir(), tmp_path / "setup.py", tmp_path / "pyproject.toml"]:
        touch(p, t)
    touch(native, t + 10)  # the editable install built the core in place ...
    touch(tmp_path / ".venv" / ".installed", t + 20)  # ... before setup marked the venv done
    assert "build_ext" not in plan()  # a fresh setup does not compile csrc/ a second time
    touch(sorted((tmp_path / "csrc").iterdir())[0], t + 30)
    assert "build_ext --inplace" in plan()
    native.unlink()
    assert "build_ext --inplace" in plan()
