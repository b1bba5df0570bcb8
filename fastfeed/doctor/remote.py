"""`fastfeed doctor s3://...`: what can be checked about a remote dataset without downloading it."""
from __future__ import annotations

from fastfeed.doctor.check import FAIL, OK, WARN, Check, gib
from fastfeed.remote.cache import default_cache_dir, default_cache_size
from fastfeed.remote.dataset import read_manifest
from fastfeed.remote.store import resolve_retry_timeout
from fastfeed.types import DatasetError

__all__ = ["check_remote"]

_DOCTOR_RETRY_S = 10.0  # at most: doctor must answer fast; a dataset that needs longer is reported as unreachable


def check_remote(url: str, storage_options: dict | None = None) -> list:
    """doctor Checks: the manifest is reachable and readable; the shard cache can hold the dataset."""
    try:
        m = read_manifest(url, storage_options, retry_timeout=min(_DOCTOR_RETRY_S, resolve_retry_timeout(None)))
    except DatasetError as e:
        return [Check("dataset", FAIL, str(e), "check the URL and the credentials/endpoint the client reads "
                      "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY/AWS_ENDPOINT_URL for s3://, "
                      "GOOGLE_APPLICATION_CREDENTIALS for gs://)")]
    total = sum(s.bytes for s in m.shards)
    out = [Check("manifest", OK, f"{url}: {m.num_samples} samples, {len(m.classes)} classes, {m.kind}, "
                 f"{len(m.shards)} shard(s), {gib(total)}")]
    cache = default_cache_dir()
    try:
        limit = default_cache_size(cache)
    except DatasetError as e:  # the folder cannot be written: the Loader would fail the same way
        out.append(Check("cache", FAIL, str(e), "set FASTFEED_CACHE to a writable local disk"))
        return out
    if total > limit:
        out.append(Check("cache", WARN, f"shard cache {cache} holds at most {gib(limit)}, the dataset is "
                         f"{gib(total)}: each rank's epoch must fit", "set FASTFEED_CACHE to a larger local disk "
                         "or FASTFEED_CACHE_SIZE higher"))
    else:
        out.append(Check("cache", OK, f"shard cache {cache} (limit {gib(limit)}) can hold the dataset"))
    return out
