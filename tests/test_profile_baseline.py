"""`fastfeed profile --baseline` on the same script at two world sizes: what only a comparison of two runs shows.
No timing is compared, so these run beside other tests (tests/test_profile.py's verdicts run alone)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_profile import CASES, profile

pytestmark = pytest.mark.integration  # torchrun runs of a script under the profiler


def test_a_learning_rate_that_does_not_follow_the_global_batch(tmp_path):
    """The same DDP script at one process, then at two against the first report: the global batch doubles, the
    learning rate stays at 0.01, and the comparison says to scale it (0.02) or keep the global batch."""
    script = str(CASES / "lr_scaling.py")
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    _, one = profile(tmp_path / "one", *run, "--nproc-per-node=1", script, steps=6, warmup=2)
    base = tmp_path / "one.json"
    base.write_text(json.dumps(one))
    proc = subprocess.run([sys.executable, "-m", "fastfeed.cli", "profile", "--steps", "6", "--warmup", "2",
                           "--then", "stop", "--baseline", str(base), "--", *run, "--nproc-per-node=2", script],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "the learning rate did not follow the global batch" in proc.stdout
    assert "global batch 32 (1 process(es)) in the baseline, 64 (2) now" in proc.stdout
    assert "the linear rule: 0.02 here" in proc.stdout
