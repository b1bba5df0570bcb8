"""Run by `make setup` after pillow-simd went in: say which package provides `PIL`, fail if the install is mixed.

pillow-simd and Pillow both install the `PIL` package, so whichever pip installed last owns the files. If both are
registered, a later `pip install` of something that depends on Pillow has overwritten pillow-simd (or the other
way round) and uninstalling either would break `import PIL`: that is an install error, not a warning.
"""
from __future__ import annotations

import sys
from importlib import metadata


def main() -> int:
    import PIL

    installed = {}
    for dist in ("pillow-simd", "Pillow"):
        try:
            installed[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    if len(installed) != 1:
        print(f"PIL {PIL.__version__}: expected exactly one of pillow-simd / Pillow, found {installed or 'none'}; "
              "run `make clean` and remove .venv, then `make setup`", file=sys.stderr)
        return 1
    (dist, version), = installed.items()
    if version != PIL.__version__:
        print(f"PIL {PIL.__version__} does not match the installed {dist} {version}", file=sys.stderr)
        return 1
    note = "" if dist == "pillow-simd" else " (pillow-simd did not build: the CPU decode path is slower)"
    print(f"PIL {PIL.__version__} from {dist}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
