"""Import numba even after a script replaced `builtins.print`.

At its first import numba registers `builtins.print` for typing and checks that the current `print` can be found
as `getattr(sys.modules[print.__module__], print.__name__)`. Scripts that replace `builtins.print` with a function
defined inside another function — torchvision's reference `setup_for_distributed`, DeiT, MAE — fail that check,
and the import raises AttributeError (seen under torchrun). So when the check would fail, numba is imported while
`builtins.print` is the module-level `print` below, which forwards to the user's, and the user's is put back.
"""
from __future__ import annotations

import builtins
import sys

__all__ = ["import_numba"]

_target = builtins.print


def print(*args, **kwargs):  # noqa: A001 - numba's check needs a module-level function named `print`
    return _target(*args, **kwargs)


def import_numba():
    if "numba" in sys.modules:
        return sys.modules["numba"]
    global _target
    user = builtins.print
    home = sys.modules.get(getattr(user, "__module__", None) or "")
    if home is not None and getattr(home, getattr(user, "__name__", ""), None) is user:
        import numba

        return numba
    _target = user
    builtins.print = print
    try:
        import numba
    finally:
        builtins.print = user
    return numba
