"""The `fastfeed` command: a thin dispatcher.

Each sub-command lives in `fastfeed/commands/<name>.py` and exposes `configure(parser)` and `run(args) -> int`.
Modules are imported only when their command runs, so `fastfeed doctor` works where DALI or torch are broken.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS = {
    "pack": "pack an image folder or a CSV/JSONL list into WebDataset shards or LMDB",
    "index": "adopt WebDataset shards written by anyone, in place: manifest, sample table, checksums",
    "merge": "join the parts of a --num-parts pack (folder or URL) into the dataset one pack would write",
    "inspect": "print a packed dataset's manifest summary",
    "verify": "check shard checksums and decode every image; non-zero exit on corruption",
    "demo-data": "write a synthetic ImageNet-like JPEG folder tree",
    "bench": "measure loader throughput and data-wait, optionally against torch's DataLoader",
    "profile": "run a training script unmodified and say what limits its step (data, compute, communication)",
    "doctor": "check this machine and a dataset for common input-pipeline problems",
}


def _module(name: str):
    return importlib.import_module(f"fastfeed.commands.{name.replace('-', '_')}")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default once, from the parser itself (help texts must not repeat it)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        # ArgumentDefaultsHelpFormatter skips defaults of None; store_true flags' False says nothing either
        if action.default is None or isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            return action.help or ""
        return super()._get_help_string(action)


def _version() -> str:
    from fastfeed.constants import __version__

    return f"fastfeed {__version__}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="fastfeed", description="Keep GPUs fed during PyTorch training.",
                                     epilog="`fastfeed COMMAND --help` describes a command's options.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = argv[0] if argv and argv[0] in COMMANDS else None
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_HelpFormatter)
        if name == wanted:  # configure only the command being run: the others may have heavy imports
            _module(name).configure(p)
    args = parser.parse_args(argv)
    if args.command is None:  # `fastfeed` alone: the overview, as a successful answer
        parser.print_help()
        return 0
    try:
        return int(_module(args.command).run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `fastfeed inspect DIR | head`: the reader has gone, which is no error of ours
        # Python would report the pipe again while flushing stdout at exit: point it at /dev/null first
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
