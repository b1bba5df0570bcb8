"""`fastfeed profile` as a process: it stops the command it runs when it is interrupted or runs past --timeout (no
process of the command left behind), reports what was measured anyway, exits with the command's own status when
the command failed, and refuses unwritable outputs and missing --report folders before running anything."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

# Real subprocesses and signals; no timing is compared. The timeouts leave a script that imports torch time to take
# its first steps on a loaded 2-core machine.
pytestmark = pytest.mark.integration

# A training loop on a DataLoader (env: WORKERS, BATCHES (-1: forever), FAIL_AT, EXIT_CODE) that prints each step.
TRAIN = textwrap.dedent("""
    import os, sys, time, torch
    from torch.utils.data import DataLoader, Dataset

    class Forever(Dataset):
        def __len__(self): return 10**6
        def __getitem__(self, i): return torch.randn(8), i % 2

    if __name__ == "__main__":
        batches, fail_at = int(os.environ.get("BATCHES", "-1")), int(os.environ.get("FAIL_AT", "-1"))
        m = torch.nn.Linear(8, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1)
        print("started", os.getpid(), flush=True)
        loader = DataLoader(Forever(), batch_size=4, num_workers=int(os.environ.get("WORKERS", "0")))
        for i, (x, y) in enumerate(loader):
            if i == batches: break
            if i == fail_at: raise RuntimeError(f"boom at batch {i}")
            time.sleep(0.02)
            loss = torch.nn.functional.cross_entropy(m(x), y); opt.zero_grad(); loss.backward(); opt.step()
            print("step", i, flush=True)
        sys.exit(int(os.environ.get("EXIT_CODE", "0")))
""")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fastfeed.cli", "profile", *args]


def _env(tmp_path, **extra) -> dict:
    # TMPDIR: the profiler's temporary folder lands in tmp_path, where the tests look for leftovers.
    return dict(os.environ, TMPDIR=str(tmp_path), **{k: str(v) for k, v in extra.items()})


def _script(tmp_path, text: str = TRAIN, name: str = "train.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _run(tmp_path, *args: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(_cli(*args), capture_output=True, text=True, timeout=120, env=_env(tmp_path, **env))


def _start(tmp_path, *args: str, until: str, **env) -> tuple[subprocess.Popen, list[str], list[psutil.Process]]:
    """`fastfeed profile ARGS` in a session of its own, read until a line starts with `until`; with its lines so far
    and every process under it then."""
    proc = subprocess.Popen(_cli(*args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(tmp_path, **env), start_new_session=True)
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, "".join(lines)
        lines.append(line)
        if line.startswith(until):
            return proc, lines, psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    raise AssertionError("".join(lines))


def _finish(proc: subprocess.Popen, lines: list[str], tree: list[psutil.Process], tmp_path) -> str:
    """Wait for profile; the command's processes must be gone with it, and the profiler's temporary folder too."""
    rest, _ = proc.communicate(timeout=60)
    out = "".join(lines) + rest
    alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, (alive, out)
    assert not list(tmp_path.glob("fastfeed-profile-*")), out
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_profile_alone_stops_the_script_and_its_workers_and_reports(tmp_path, sig):
    """SIGINT or SIGTERM to profile's pid only (not its group): the script and its DataLoader workers stop, the
    window measured before is reported and written to --json, and profile exits 128+N."""
    proc, lines, tree = _start(tmp_path, "--warmup", "1", "--steps", "3", "--json", str(tmp_path / "r.json"), "--",
                               sys.executable, _script(tmp_path), until="step 8", WORKERS=2)
    assert len(tree) >= 3, tree  # the script and its two workers
    os.kill(proc.pid, sig)
    out = _finish(proc, lines, tree, tmp_path)
    assert proc.returncode == 128 + sig, out
    assert "3 steps measured on 1 process(es)" in out
    assert f"got {signal.Signals(sig).name}: stopped the command" in out
    assert json.loads((tmp_path / "r.json").read_text())["processes"][0]["steps"] == 3


def test_a_ctrl_c_to_the_whole_group_still_stops_everything(tmp_path):
    """SIGINT to profile's whole process group, as a terminal sends it: the script gets it (maybe twice) and ends."""
    proc, lines, tree = _start(tmp_path, "--warmup", "1", "--steps", "3", "--", sys.executable, _script(tmp_path),
                               until="step 8", WORKERS=2)
    os.killpg(proc.pid, signal.SIGINT)
    out = _finish(proc, lines, tree, tmp_path)
    assert proc.returncode == 130, out
    assert "3 steps measured" in out


def test_timeout_stops_the_script_reports_and_exits_124(tmp_path):
    t0 = time.monotonic()
    proc = _run(tmp_path, "--timeout", "15", "--warmup", "1", "--steps", "3", "--", sys.executable,
                _script(tmp_path), WORKERS=1)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 124, out
    assert time.monotonic() - t0 < 35, out
    assert "3 steps measured" in out and "ran past --timeout 15s: stopped the command" in out
    assert not list(tmp_path.glob("fastfeed-profile-*")), out


def test_a_timeout_inside_the_window_reports_the_steps_measured_so_far(tmp_path):
    """--timeout before the window is complete: the script's SIGTERM writes the steps it measured, then it dies of
    the signal as it would have (before, it died with them and nothing was reported)."""
    proc = _run(tmp_path, "--timeout", "12", "--warmup", "1", "--steps", "100000", "--json", str(tmp_path / "r.json"),
                "--", sys.executable, _script(tmp_path))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 124, out
    steps = json.loads((tmp_path / "r.json").read_text())["processes"][0]["steps"]
    assert 10 < steps < 100000 and f"{steps} steps measured on 1 process(es)" in out, out
    assert "the command was killed by SIGTERM" in out


def test_a_command_deaf_to_sigterm_is_killed_after_the_grace_with_what_it_started(tmp_path):
    """A command that ignores SIGTERM, and a process it started in a session of its own (as torchrun starts its
    ranks): both killed once the grace period is over."""
    child = _script(tmp_path, "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(300)\n",
                    "deaf_child.py")
    deaf = _script(tmp_path, textwrap.dedent(f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        subprocess.Popen([sys.executable, {child!r}], start_new_session=True)
        print("started", flush=True)
        time.sleep(300)
    """), "deaf.py")
    code = ("import sys; from fastfeed.profile.run import profile_command; "
            f"status, s = profile_command([sys.executable, {deaf!r}], timeout=8, grace=1); "
            "print('exit', s['exit'], flush=True)")
    t0 = time.monotonic()
    run = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=_env(tmp_path),
                           start_new_session=True)
    assert run.stdout.readline() == "started\n"
    time.sleep(0.5)
    tree = psutil.Process(run.pid).children(recursive=True)
    assert len(tree) == 2, tree
    out, _ = run.communicate(timeout=60)
    assert run.returncode == 0 and time.monotonic() - t0 < 30, out
    assert "'status': 137, 'signal': 'SIGKILL', 'stopped_by': 'timeout'" in out
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize("then, env, status, says", [
    ("stop", {"FAIL_AT": 6}, 1, "3 steps measured on 1 process(es)"),  # fails inside the window of 6
    ("stop", {"BATCHES": 4, "EXIT_CODE": 3}, 3, "the command exited with status 3"),  # ends before the window does
    ("stop", {"EXIT_CODE": 3}, 0, "6 steps measured"),  # stopped by profile after the window: a success
    ("continue", {"BATCHES": 12, "EXIT_CODE": 3}, 3, "the command exited with status 3"),
])
def test_profile_exits_with_the_scripts_own_status(tmp_path, then, env, status, says):
    proc = _run(tmp_path, "--warmup", "3", "--steps", "6", "--then", then, "--", sys.executable, _script(tmp_path),
                **env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == status, out
    assert says in out
    if status:
        assert f"the command exited with status {status}" in out


@pytest.mark.parametrize("code, status, says", [
    ("import sys; sys.exit(7)", 7, "no step was measured (the command exited with status 7)"),
    ("import os; os.kill(os.getpid(), 9)", 137, "the command was killed by SIGKILL, exit status 137"),
])
def test_a_script_that_dies_before_any_step_gives_its_status(tmp_path, code, status, says):
    proc = _run(tmp_path, "--", sys.executable, "-c", code)
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert says in proc.stdout


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_output_in_a_missing_folder_is_refused_before_the_run(tmp_path, option):
    marker = tmp_path / "ran"
    script = _script(tmp_path, f"open({str(marker)!r}, 'w').close()\n", "marker.py")
    proc = _run(tmp_path, option, str(tmp_path / "missing" / "out.x"), "--", sys.executable, script)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{option} {tmp_path / 'missing' / 'out.x'}: no such folder" in proc.stderr
    assert not marker.exists()  # the script never started


def test_report_of_a_missing_or_empty_folder_says_so(tmp_path):
    proc = _run(tmp_path, "--report", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "no such folder" in proc.stderr, proc.stdout + proc.stderr
    proc = _run(tmp_path, "--report", str(tmp_path))
    assert proc.returncode == 2 and "holds no profile records" in proc.stderr, proc.stdout + proc.stderr
