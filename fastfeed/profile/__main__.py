"""`python -m fastfeed.profile SCRIPT ARGS` (e.g. `torchrun --nproc-per-node 8 -m fastfeed.profile train.py ...`):
run SCRIPT as __main__ with the profiler's hooks installed in this process. Each process writes its records to
$FASTFEED_PROFILE_DIR (default ./fastfeed-profile); `fastfeed profile --report DIR` prints the table and verdict."""
import os
import runpy
import sys

from fastfeed.profile.probe import ENV_DIR, install


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m fastfeed.profile SCRIPT [ARGS...]")
    out = os.environ.setdefault(ENV_DIR, os.path.abspath("fastfeed-profile"))
    install(out)
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
