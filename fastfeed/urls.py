"""What counts as a URL, written once: `scheme://...` is a URL except `file://`, which is a local path."""
from __future__ import annotations

import os
import re

__all__ = ["has_scheme", "is_url", "local_path"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def has_scheme(path) -> bool:
    """True for any `scheme://...` string, file:// included (a manifest's data_root may be either)."""
    return isinstance(path, str) and _SCHEME.match(path) is not None


def is_url(path) -> bool:
    """True for `scheme://...` (s3://, gs://, https://, memory://, ...) except file://, which is a local path."""
    return has_scheme(path) and not path.startswith("file://")


def local_path(path) -> str:
    """A local path for `path` (strips file://)."""
    path = os.fspath(path)
    return path[len("file://"):] if isinstance(path, str) and path.startswith("file://") else path
