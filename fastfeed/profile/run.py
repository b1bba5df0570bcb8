"""Launch the profiled command with the hooks in every Python process it starts, and read back what they measured."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time

from fastfeed.profile.probe import DEFAULT_STEPS, DEFAULT_WARMUP, ENV_DIR, ENV_OPTIONS, THEN
from fastfeed.profile.report import load_records, summarize

__all__ = ["profile_command", "SITE_DIR", "STOP_GRACE_S", "STOP_STATUS"]

SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")
# How long a stopped command gets to end on its own (torchrun stopping its ranks) before it is killed.
STOP_GRACE_S = 30.0
# This process's exit status when it stopped the command: a signal's death (128+N), or timeout(1)'s.
STOP_STATUS = {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM, "timeout": 124}
_CAUGHT = (signal.SIGINT, signal.SIGTERM)
# siginfo's si_code of a signal the kernel sent: a terminal's Ctrl-C, which reached the command's group too.
_SI_KERNEL = 0x80
_POLL_S = 0.5


def profile_command(cmd: list[str], *, warmup: int = DEFAULT_WARMUP, steps: int = DEFAULT_STEPS, then: str = THEN[0],
                    out_dir: str | None = None, timeout: float | None = None,
                    grace: float = STOP_GRACE_S) -> tuple[int, dict]:
    """Run `cmd` (unmodified: `python train.py ...`, `torchrun ...`) with the profiler's sitecustomize first on
    PYTHONPATH; return (its exit status, a signal's death as 128+N; the summary of the measured window). SIGINT or
    SIGTERM to this process, or `timeout` seconds, stop the command (see _wait); the summary's "exit" says how it
    ended."""
    if not cmd:
        raise ValueError("no command to profile: fastfeed profile [options] -- python train.py ...")
    if then not in THEN:
        raise ValueError(f"then must be one of {THEN}, got {then!r}")
    if warmup < 0 or steps < 1:
        raise ValueError(f"warmup must be >= 0 and steps >= 1, got {warmup} and {steps}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    with tempfile.TemporaryDirectory(prefix="fastfeed-profile-") as tmp:
        folder = out_dir or tmp
        os.makedirs(folder, exist_ok=True)
        # The package itself must be importable in the child (a checkout run without installing).
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        path = [SITE_DIR, package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **{
            ENV_DIR: folder, ENV_OPTIONS: json.dumps({"warmup": warmup, "steps": steps, "then": then})})
        ended = _run(cmd, env, timeout, grace)
        summary = summarize(load_records(folder))
        summary["exit"] = ended
        return ended["status"], summary


def _run(cmd: list[str], env: dict, timeout: float | None, grace: float) -> dict:
    """Run `cmd` in this process's group (a terminal's Ctrl-C reaches it as it would without the profiler) until it
    ends. SIGINT and SIGTERM are blocked here and taken with sigtimedwait, so that this process always gets to stop
    the command, wait for it and read its records."""
    watched = {*_CAUGHT, signal.SIGCHLD}  # SIGCHLD: wake as soon as the command ends
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    try:
        proc = subprocess.Popen(cmd, env=env, preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_SETMASK, old_mask))
        return _wait(proc, watched, timeout, grace)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _wait(proc: subprocess.Popen, watched: set, timeout: float | None, grace: float) -> dict:
    """Wait for `proc`. On SIGINT or SIGTERM, forward it (torchrun stops its ranks on either; a terminal's Ctrl-C
    reached the command already); at the timeout send SIGTERM, as timeout(1). After `grace` seconds, or a second
    interrupt, kill it (its group, if it has its own), and what it had started that outlived it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    stopped_by, kill_at, family = None, None, set()
    while proc.poll() is None:
        now = time.monotonic()
        if stopped_by is None and deadline is not None and now >= deadline:
            stopped_by, kill_at, family = "timeout", now + grace, _descendants(proc.pid)
            proc.send_signal(signal.SIGTERM)
        elif kill_at is not None and now >= kill_at:
            _kill(proc, family | _descendants(proc.pid))
        if stopped_by is not None:  # the command's processes, before its end orphans them
            family |= _descendants(proc.pid)
        wake = [t - now for t in (deadline if stopped_by is None else None, kill_at) if t is not None]
        info = signal.sigtimedwait(watched, max(0.01, min([_POLL_S, *wake])))
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        if stopped_by is not None:  # asked twice: no more waiting
            kill_at = time.monotonic()
            continue
        stopped_by, kill_at = signal.Signals(info.si_signo).name, time.monotonic() + grace
        family = _descendants(proc.pid)
        if info.si_code != _SI_KERNEL:
            proc.send_signal(info.si_signo)
    if stopped_by is not None:
        _end_orphans(family, kill_at)
    rc = proc.returncode
    return {"status": 128 - rc if rc < 0 else rc, "signal": signal.Signals(-rc).name if rc < 0 else None,
            "stopped_by": stopped_by}


def _kill(proc: subprocess.Popen, family: set) -> None:
    try:
        if os.getpgid(proc.pid) == proc.pid:  # its own group (a session of its own): all of it
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass
    _signal_all(family, signal.SIGKILL)


def _end_orphans(family: set, kill_at: float) -> None:
    """The stopped command's processes that outlived it (DataLoader workers of a script SIGTERM killed, ranks in
    sessions of their own): SIGTERM, then SIGKILL at `kill_at`."""
    left = {p for p in family if _alive(p)}
    _signal_all(left, signal.SIGTERM)
    while left and time.monotonic() < kill_at:
        time.sleep(0.05)
        left = {p for p in left if _alive(p)}
    _signal_all(left, signal.SIGKILL)


def _descendants(pid: int) -> set[tuple[int, str]]:
    """The processes under `pid`, each as (pid, start time): a pid reused since is not theirs."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        stat = _stat(int(entry)) if entry.isdigit() else None
        if stat is not None:
            children.setdefault(int(stat[1]), []).append((int(entry), stat[19]))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in out:
                out.add(child)
                todo.append(child[0])
    return out


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, ...), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(p: tuple[int, str]) -> bool:
    stat = _stat(p[0])
    return stat is not None and stat[19] == p[1] and stat[0] != "Z"


def _signal_all(family: set, sig: int) -> None:
    for p in family:
        if _alive(p):
            try:
                os.kill(p[0], sig)
            except ProcessLookupError:
                pass
