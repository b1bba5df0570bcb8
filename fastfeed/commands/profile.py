"""`fastfeed profile [options] -- python train.py ARGS`: run a training script unmodified, measure a window of its
steps, attribute the step time, and say what limits it (fastfeed/profile/)."""
from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    from fastfeed.profile.probe import DEFAULT_STEPS, DEFAULT_WARMUP, THEN
    from fastfeed.profile.run import STOP_GRACE_S

    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="command",
                   help="the training command after `--` (python train.py ..., torchrun ...)")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="steps left unmeasured first")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="steps measured")
    p.add_argument("--then", choices=THEN, default=THEN[0],
                   help="after the window: let the script run on, or stop it")
    p.add_argument("--json", default=None, help="write the report here (a baseline for a later --baseline)")
    p.add_argument("--baseline", default=None, help="a report written by --json: print the deltas against it")
    p.add_argument("--plot", default=None, metavar="FILE.png",
                   help="draw the window: a stacked bar per step (data, h2d, forward, backward, ...), a row per rank")
    p.add_argument("--report", default=None, metavar="DIR",
                   help="no command: print the report of the records in DIR ($FASTFEED_PROFILE_DIR of a "
                        "`python -m fastfeed.profile` run)")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help=f"stop the command after this long (SIGTERM, SIGKILL {STOP_GRACE_S:g} s later if it lingers), "
                        "print the report of what was measured, and exit with status 124, as timeout(1)")


def run(args: argparse.Namespace) -> int:
    from fastfeed.profile.report import format_report, load_records, record_files, summarize
    from fastfeed.profile.run import STOP_STATUS, profile_command

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    try:
        baseline = json.load(open(args.baseline)) if args.baseline else None
        for option, dest in (("--json", args.json), ("--plot", args.plot)):
            _check_writable(option, dest)
        if args.report:
            if not os.path.isdir(args.report):
                raise ValueError(f"--report {args.report}: no such folder")
            if not record_files(args.report):
                raise ValueError(f"--report {args.report}: the folder holds no profile records")
            status, summary = 0, summarize(load_records(args.report))
        else:
            status, summary = profile_command(cmd, warmup=args.warmup, steps=args.steps, then=args.then,
                                              timeout=args.timeout)
    except (ValueError, OSError) as e:
        print(f"fastfeed profile: error: {e}", file=sys.stderr)
        return 2
    if baseline is not None and summary["run"] is not None:
        from fastfeed.profile.rules import against_baseline

        summary["verdict"] = summary["verdict"] + against_baseline(summary, baseline)
    print(format_report(summary, baseline), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    if args.plot and summary["run"] is not None:
        from fastfeed.profile.timeline import plot_timeline

        try:
            plot_timeline(summary, args.plot)
        except (ValueError, OSError) as e:
            print(f"fastfeed profile: error: {e}", file=sys.stderr)
            return 2
    stopped_by = (summary.get("exit") or {}).get("stopped_by")
    if stopped_by is not None:
        why = f"ran past --timeout {args.timeout:g}s" if stopped_by == "timeout" else f"got {stopped_by}"
        print(f"fastfeed profile: {why}: stopped the command", file=sys.stderr)
        return STOP_STATUS[stopped_by]
    # The command's own failure first (--then stop ends a healthy script with status 0); then, no measured step.
    if status:
        return status
    return 1 if summary["run"] is None else 0


def _check_writable(option: str, path: str | None) -> None:
    """Refuse an output the run could not write, before the run rather than after it."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: no such folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: the folder {folder} is not writable")
