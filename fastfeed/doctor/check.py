"""One doctor check's result, shared by the local checks (checks.py) and the remote ones (remote.py)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Check", "OK", "WARN", "FAIL", "gib"]

OK, WARN, FAIL = "OK", "WARN", "FAIL"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    message: str
    fix: str = ""


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
