"""Object-store access through fsspec: URL detection, the filesystem for a URL, and bounded retries.

Credentials and endpoints are whatever fsspec/s3fs/gcsfs already read (AWS_* environment variables including
AWS_ENDPOINT_URL, ~/.aws, GOOGLE_APPLICATION_CREDENTIALS, ...) or the caller's `storage_options`, passed unchanged
to `fsspec.core.url_to_fs`. No HTTP is written here.

Retries: the clients retry some errors themselves; on top of that `retrying()` repeats an operation with
exponential backoff (0.2 s doubling to 5 s) until `timeout` seconds (default $FASTFEED_RETRY_TIMEOUT, else 60)
have passed since the first attempt, then
raises `DatasetError` naming what it was doing. The total time is bounded by `timeout` plus one attempt (whose
own length is bounded by the client's connect/read timeouts). Errors that retrying cannot fix (missing object,
access denied, a full or read-only local disk: LOCAL_DISK_ERRNOS) are raised at once.
"""
from __future__ import annotations

import errno
import os
import time
from typing import Callable, TypeVar

from fastfeed.types import DatasetError
from fastfeed.urls import is_url, local_path  # noqa: F401  (re-exported: the remote modules import them here)

__all__ = ["is_url", "url_to_fs", "join", "retrying", "resolve_retry_timeout", "missing_bucket",
           "DEFAULT_RETRY_TIMEOUT", "PERMANENT_ERRORS", "LOCAL_DISK_ERRNOS"]

T = TypeVar("T")

DEFAULT_RETRY_TIMEOUT = 60.0  # seconds of retrying one remote operation before DatasetError
PERMANENT_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
# Writing the local copy failed for want of room (disk or quota full, a file-size limit) or a read-only disk:
# retrying cannot fix that, and a minute of retries would only hide it.
LOCAL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def url_to_fs(url: str, storage_options: dict | None = None):
    """(fsspec filesystem, path inside it) for `url`. Raises DatasetError for an unknown protocol or a missing
    client package (e.g. s3fs for s3://), with the package to install."""
    import fsspec

    # fsspec caches filesystem instances by their arguments (per thread), not by the environment they read:
    # without this, a process that changes AWS_ENDPOINT_URL or credentials would keep talking to the old ones.
    options = {"skip_instance_cache": True, **(storage_options or {})}
    try:
        return fsspec.core.url_to_fs(url, **options)
    except ImportError as e:
        raise DatasetError(f"{url}: the fsspec client for this protocol is not installed ({e})") from None
    except ValueError as e:
        raise DatasetError(f"{url}: {e}") from None


def missing_bucket(fs, url: str, base: str) -> str | None:
    """What to say when the bucket of an s3:// or gs:// URL does not exist, else None (it exists, it is not a
    bucket URL, or these credentials may not look at it: the operation itself decides then)."""
    if url.split("://", 1)[0] not in ("s3", "s3a", "gs", "gcs"):
        return None
    bucket = base.strip("/").split("/", 1)[0]
    try:
        exists = retrying(lambda: fs.exists(bucket), f"look at bucket {bucket!r}")
    except DatasetError as e:
        if isinstance(e.__cause__, PermissionError):
            return None
        raise
    return None if exists else f"{url}: bucket {bucket!r} does not exist (or these credentials cannot see it)"


def join(base: str, *names: str) -> str:
    return "/".join([base.rstrip("/"), *(n.strip("/") for n in names)])


def resolve_retry_timeout(timeout: float | None) -> float:
    """`timeout`, else $FASTFEED_RETRY_TIMEOUT (seconds), else DEFAULT_RETRY_TIMEOUT."""
    if timeout is None:
        timeout = float(os.environ.get("FASTFEED_RETRY_TIMEOUT", DEFAULT_RETRY_TIMEOUT))
    if not timeout >= 0:
        raise ValueError(f"retry timeout must be >= 0 seconds, got {timeout}")
    return float(timeout)


def retrying(op: Callable[[], T], what: str, timeout: float | None = None,
             permanent: tuple[type[BaseException], ...] = PERMANENT_ERRORS) -> T:
    """Run `op()` until it succeeds or `timeout` seconds (None: `resolve_retry_timeout`) have passed; then
    DatasetError naming `what`."""
    timeout = resolve_retry_timeout(timeout)
    start = time.monotonic()
    delay = 0.2
    attempts = 0
    while True:
        attempts += 1
        try:
            return op()
        except permanent as e:
            raise DatasetError(f"{what}: {type(e).__name__}: {e}") from e
        except DatasetError:
            raise
        except Exception as e:  # noqa: BLE001 - client stacks raise many types for one dropped connection
            if isinstance(e, OSError) and e.errno in LOCAL_DISK_ERRNOS:
                raise DatasetError(f"{what}: {e.strerror or e} (a local disk's error: retrying cannot fix it)") from e
            left = timeout - (time.monotonic() - start)
            if left <= 0:
                raise DatasetError(f"{what}: failed after {attempts} attempt(s) over {time.monotonic() - start:.1f} s "
                                   f"(retry timeout {timeout:g} s): {type(e).__name__}: {e}") from e
            time.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)
