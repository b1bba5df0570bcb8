"""`fastfeed profile [options] -- python train.py ARGS`: run a training script unmodified, measure a window of its
steps, attribute the step time, and say what limits it (fastfeed/profile/)."""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["configure", "run"]


def configure(p: argparse.ArgumentParser) -> None:
    from fastfeed.profile.probe import DEFAULT_STEPS, DEFAULT_WARMUP, THEN

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
    p.add_argument("--timeout", type=float, default=None, help="seconds before the command is killed")


def run(args: argparse.Namespace) -> int:
    from fastfeed.profile.report import format_report, load_records, summarize
    from fastfeed.profile.run import profile_command

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    try:
        baseline = json.load(open(args.baseline)) if args.baseline else None
        if args.report:
            status, summary = 0, summarize(load_records(args.report))
        else:
            status, summary = profile_command(cmd, warmup=args.warmup, steps=args.steps, then=args.then)
    except (ValueError, OSError) as e:
        print(f"fastfeed profile: error: {e}", file=sys.stderr)
        return 2
    if baseline is not None and summary["run"] is not None:
        from fastfeed.profile.rules import against_baseline

        summary["verdict"] = summary["verdict"] + against_baseline(summary, baseline)
    print(format_report(summary, baseline))
    if args.plot and summary["run"] is not None:
        from fastfeed.profile.timeline import plot_timeline

        try:
            plot_timeline(summary, args.plot)
        except (ValueError, OSError) as e:
            print(f"fastfeed profile: error: {e}", file=sys.stderr)
            return 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    if summary["run"] is None:
        return 1
    return 0 if args.then == "stop" else status
