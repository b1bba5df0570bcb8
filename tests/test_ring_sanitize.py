"""The native core's tests (ring, JPEG transcoder) pass against an AddressSanitizer + UBSan build of the native core,
with no sanitizer report.

tools/sanitize.sh builds the instrumented extension in a temporary copy (the working tree's build is untouched);
`tools/sanitize.sh thread` does the same with ThreadSanitizer (`make test-sanitize` runs both).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.sanitize
def test_ring_under_address_and_undefined_sanitizers(sanitize_build):
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the sanitizer variant of the native core")
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("FASTFEED_RING_SANITIZE", None)
    if sanitize_build is not None:  # built while the earlier tests ran (tests/conftest.py)
        env["SANITIZE_BUILD_DIR"] = sanitize_build
    proc = subprocess.run(["bash", str(ROOT / "tools" / "sanitize.sh"), "address"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    assert not re.search(r"(Address|UndefinedBehavior|Leak)Sanitizer|runtime error:", out), out[-8000:]
    assert proc.returncode == 0, out[-8000:]
    assert re.search(r"^\d+ passed", out, re.M) and not re.search(r"\d+ failed", out), out[-8000:]
    assert "clean" in out
