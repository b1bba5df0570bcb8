"""`fastfeed doctor`: checks of this machine and a dataset, each one line OK / WARN / FAIL with the concrete fix.

    run_checks(dataset=None)   every check: checks.py (machine, dataset), remote.py (a dataset at a URL)
    readprobe.read_probe(path) random direct reads: the storage's own speed, not the page cache's
"""
from __future__ import annotations

from fastfeed.doctor.check import FAIL, OK, WARN, Check
from fastfeed.doctor.checks import format_checks, run_checks, to_json

__all__ = ["Check", "OK", "WARN", "FAIL", "run_checks", "format_checks", "to_json"]
