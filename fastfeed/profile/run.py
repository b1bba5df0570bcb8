"""Launch the profiled command with the hooks in every Python process it starts, and read back what they measured."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile

from fastfeed.profile.probe import DEFAULT_STEPS, DEFAULT_WARMUP, ENV_DIR, ENV_OPTIONS, THEN
from fastfeed.profile.report import load_records, summarize

__all__ = ["profile_command", "SITE_DIR"]

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")


def profile_command(cmd: list[str], *, warmup: int = DEFAULT_WARMUP, steps: int = DEFAULT_STEPS, then: str = THEN[0],
                    out_dir: str | None = None, timeout: float | None = None) -> tuple[int, dict]:
    """Run `cmd` (unmodified: `python train.py ...`, `torchrun ...`) with the profiler's sitecustomize first on
    PYTHONPATH; return (its exit status, the summary of the measured window)."""
    if not cmd:
        raise ValueError("no command to profile: fastfeed profile [options] -- python train.py ...")
    if then not in THEN:
        raise ValueError(f"then must be one of {THEN}, got {then!r}")
    if warmup < 0 or steps < 1:
        raise ValueError(f"warmup must be >= 0 and steps >= 1, got {warmup} and {steps}")
    with tempfile.TemporaryDirectory(prefix="fastfeed-profile-") as tmp:
        folder = out_dir or tmp
        os.makedirs(folder, exist_ok=True)
        # The package itself must be importable in the child (a checkout run without installing).
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = [SITE_DIR, package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **{
            ENV_DIR: folder, ENV_OPTIONS: json.dumps({"warmup": warmup, "steps": steps, "then": then})})
        proc = subprocess.run(cmd, env=env, timeout=timeout)
        return proc.returncode, summarize(load_records(folder))
