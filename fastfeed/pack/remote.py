"""`fastfeed pack` with URLs (SRC and/or OUT) and with `--engine ray`.

OUT a URL: pack into a local staging folder (`--staging`, default a temporary folder removed afterwards), then
upload the data files, then the sample tables, then part manifests, and the dataset's fastfeed.json LAST. An
object appears to readers only once its upload completed, so a reader that finds the manifest finds every file
it lists complete. `--overwrite` deletes the old manifest first (readers then see "no dataset", never a manifest
next to half-replaced shards), then fastfeed's old objects. A URL is never turned into a local folder: the
local packer only ever sees the staging path.

SRC a URL: the tree is downloaded to a temporary folder first (simple and correct); the manifests record the URL
as `source`.

`--num-parts K --part i` with OUT a URL (a Slurm array writing to object storage): the part is uploaded to
OUT/part-NNNNN, its manifest last; `fastfeed merge OUT` (merge_any) downloads the parts, merges them locally,
uploads the dataset with its manifest last, then deletes the remote parts.

`--engine ray`: the K parts of the existing `--num-parts/--part` plan (K = --num-parts, or the cluster's CPUs
when not given) run as Ray tasks (a local Ray started here, or `--ray-address`), each into OUT/part-NNNNN, then
`fastfeed.pack.merge` joins them exactly as `fastfeed merge` would: the result is byte-identical to a
one-process pack with the same options (pack/merge.py says how). On a multi-node cluster OUT (or --staging,
when OUT is a URL) must be a folder every node sees.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from dataclasses import asdict, replace

from fastfeed.pack import PackError, PackOptions, PackResult, merge, pack
from fastfeed.pack.merge import part_names
from fastfeed.pack.run import OWNED_NAMES, clear_folder, part_folder
from fastfeed.remote.store import is_url, join, local_path, missing_bucket, retrying, url_to_fs
from fastfeed.types import MANIFEST_NAME, Manifest
from fastfeed.world import usable_cpus

__all__ = ["add_arguments", "pack_any", "pack_ray", "merge_any", "upload_dataset", "ENGINES"]

ENGINES = ("local", "ray")
_JOURNAL = ".fastfeed-pack"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="ray: run the --num-parts parts as Ray tasks and merge them (default: local)")
    p.add_argument("--ray-address", default=None, help="Ray cluster to use (default: start a local Ray)")
    p.add_argument("--staging", default=None,
                   help="local folder to pack into before uploading when OUT is a URL (default: a temp folder; "
                        "give one to be able to --resume)")


def pack_any(src: str, out: str, o: PackOptions, *, engine: str = "local", ray_address: str | None = None,
             staging: str | None = None, storage_options: dict | None = None,
             retry_timeout: float | None = None) -> PackResult:
    """`pack` (or `pack_ray`) with SRC and OUT each a local path or an fsspec URL."""
    if engine not in ENGINES:
        raise PackError(f"--engine must be one of {ENGINES}, got {engine!r}")
    import time

    t0 = time.perf_counter()
    src, out = local_path(src), local_path(out)
    temps: list[str] = []
    try:
        local_out = out
        # One part of a --num-parts pack (a Slurm array task) to a URL lands in OUT/part-NNNNN, with its own
        # manifest last; `fastfeed merge OUT` joins the parts there. --engine ray merges before the upload.
        target = out
        if is_url(out) and o.num_parts > 1 and engine != "ray":
            target = f"{out.rstrip('/')}/{part_folder('', o.part)}"
            _check_not_merged(out, storage_options)
        if is_url(out):  # before any download or packing: refuse early
            _check_remote_out(target, o, storage_options)
            if staging is None:
                local_out = tempfile.mkdtemp(prefix="fastfeed-stage-")
                temps.append(local_out)
            else:
                local_out = os.path.abspath(staging)
        local_src = src
        if is_url(src):
            local_src = tempfile.mkdtemp(prefix="fastfeed-src-")
            temps.append(local_src)
            _download_tree(src, local_src, storage_options, retry_timeout)
        result = pack_ray(local_src, local_out, o, ray_address) if engine == "ray" else pack(local_src, local_out, o)
        if is_url(src):
            _set_source(local_out, src)
            result = replace(result, manifest=replace(result.manifest, source=src))
        if is_url(out):
            if o.overwrite:
                _clear_remote(target, storage_options, retry_timeout)
            upload_dataset(result.folder, target, storage_options, retry_timeout)
            result = replace(result, folder=target)
        if is_url(src) or is_url(out):  # the summary's rate covers the transfers too
            result = replace(result, seconds=time.perf_counter() - t0)
        return result
    finally:
        for t in temps:
            shutil.rmtree(t, ignore_errors=True)


def pack_ray(src: str, out: str, o: PackOptions, address: str | None = None) -> PackResult:
    """Run every part of a `num_parts` pack as a Ray task into OUT/part-NNNNN, then merge into OUT."""
    import time

    try:
        import ray
    except ImportError:
        raise PackError("--engine ray needs the `ray` package (pip install ray)") from None
    t0 = time.perf_counter()
    started = False
    if not ray.is_initialized():
        kwargs = {} if address else {"num_cpus": usable_cpus(), "object_store_memory": 80 << 20}
        _probe(address)
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **kwargs)
        except Exception as e:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError, ...
            raise PackError(f"cannot {'connect to Ray at ' + address if address else 'start a local Ray'}: "
                            f"{type(e).__name__}: {e}") from None
        started = True
    try:
        k = o.num_parts if o.num_parts > 1 else max(1, int(ray.cluster_resources().get("CPU", 1)))
        out = os.path.abspath(out)
        if o.overwrite:  # the merged dataset and every part go, here, before any task writes
            clear_folder(out)
        opts = asdict(replace(o, num_parts=k, progress=False, workers=o.workers or 2))
        task = ray.remote(num_cpus=1, max_retries=0)(_pack_part)
        refs = [task.remote(os.path.abspath(src), out, dict(opts, part=i)) for i in range(k)]
        results = _gather(ray, refs)
    finally:
        if started:
            ray.shutdown()
    rejected = [r for part in results for r in part["rejected"]]
    manifest = merge(out)
    return PackResult(out, manifest, rejected, time.perf_counter() - t0, sum(r["hidden_skipped"] for r in results))


def _gather(ray, refs: list) -> list:
    """Every task's result; on the first failure, the other tasks are cancelled and waited for before the error
    (the part's own, e.g. a PackError, not Ray's traceback) is raised: no task may still be writing into OUT
    when pack_ray returns (a retry right after would find its part folders in use). A cancelled part keeps its
    journal, so `--resume` finishes it."""
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(done[0])
        except ray.exceptions.RayTaskError as e:
            for r in pending:
                ray.cancel(r)
            if pending:
                ray.wait(pending, num_returns=len(pending))
            cause = getattr(e, "cause", None) or e
            raise PackError(f"a Ray pack task failed: {cause}") from None
    return ray.get(refs)


def _probe(address: str | None, timeout: float = 10.0) -> None:
    """ray.init keeps retrying an unreachable `host:port` for minutes: find out first, in bounded time."""
    import socket

    if not address or "://" in address or ":" not in address:
        return  # local Ray, "auto", or a ray:// client address: Ray's own checks apply
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except (OSError, ValueError) as e:
        raise PackError(f"--ray-address {address}: cannot connect ({e}); is the Ray head running there?") from None


def _pack_part(src: str, out: str, opts: dict) -> dict:
    """A Ray task: one part; returns plain data (no fastfeed objects cross the wire)."""
    r = pack(src, out, PackOptions(**opts))
    return {"rejected": r.rejected, "hidden_skipped": r.hidden_skipped}


def merge_any(out: str, *, staging: str | None = None, storage_options: dict | None = None,
              retry_timeout: float | None = None) -> tuple[Manifest, int]:
    """`fastfeed merge` with OUT a local folder or an fsspec URL; returns (the manifest, the number of parts).

    A URL: the parts are downloaded into `staging` (default a temporary folder, removed afterwards), merged there
    (fastfeed.pack.merge), the merged dataset is uploaded with its manifest last (upload_dataset), and only then
    are the remote parts deleted: a reader sees the parts, or the parts and a complete dataset, or the dataset."""
    out = local_path(out)
    if not is_url(out):
        count = len(part_names(os.listdir(out))) if os.path.isdir(out) else 0
        return merge(out), count
    fs, base = url_to_fs(out, storage_options)
    names = retrying(lambda: _remote_names(fs, base), f"list {out}", retry_timeout)
    if MANIFEST_NAME in names:
        raise PackError(f"{out} already holds a merged dataset; delete {MANIFEST_NAME} there to merge again")
    parts = part_names({n.split("/", 1)[0] for n in names if "/" in n})
    if not parts:
        raise PackError(f"{out}: no part-NNNNN folders to merge")
    if staging is not None and os.path.isdir(staging) and os.listdir(staging):
        raise PackError(f"--staging {staging} is not empty")
    local = tempfile.mkdtemp(prefix="fastfeed-merge-") if staging is None else os.path.abspath(staging)
    try:
        for p in parts:
            _download_tree(f"{out.rstrip('/')}/{p}", os.path.join(local, p), storage_options, retry_timeout)
        manifest = merge(local)
        upload_dataset(local, out, storage_options, retry_timeout)
        for n in sorted(names):
            if n.split("/", 1)[0] in parts:
                retrying(lambda: fs.rm_file(join(base, n)), f"delete {out}/{n}", retry_timeout)
        return manifest, len(parts)
    finally:
        if staging is None:
            shutil.rmtree(local, ignore_errors=True)


# ---------------------------------------------------------------------- remote folders
def upload_dataset(folder: str, url: str, storage_options: dict | None = None,
                   retry_timeout: float | None = None) -> None:
    """Upload a finished dataset folder: data files, then tables, then part manifests, the manifest last."""
    fs, base = url_to_fs(url, storage_options)
    files = []
    for d, dirs, names in os.walk(folder):
        dirs[:] = [x for x in dirs if x != _JOURNAL]
        files.extend(os.path.relpath(os.path.join(d, n), folder) for n in names
                     if not n.endswith((".tmp", ".part")) and n != "lock.mdb")  # LMDB runtime state, not data

    def rank(rel: str) -> tuple:
        name = os.path.basename(rel)
        if rel == MANIFEST_NAME:
            return (3, rel)
        if name == MANIFEST_NAME:
            return (2, rel)
        return (1 if name.endswith((".npz", ".jsonl")) else 0, rel)

    for rel in sorted(files, key=rank):
        target = join(base, rel.replace(os.sep, "/"))
        local = os.path.join(folder, rel)
        retrying(lambda: fs.put_file(local, target), f"upload {local} -> {url}/{rel}", retry_timeout)


def _check_remote_out(url: str, o: PackOptions, storage_options: dict | None) -> None:
    """Refuse like the local packer does: an existing dataset or foreign objects without --overwrite."""
    if o.resume:
        return  # the staging folder holds the interrupted pack; the upload happens at the end
    fs, base = url_to_fs(url, storage_options)
    _check_bucket(fs, url, base)
    names = _remote_names(fs, base)
    if not names or o.overwrite:
        strangers = sorted(n for n in names if not _owned(n))
        if strangers:
            raise PackError(f"{url} holds objects fastfeed did not write ({', '.join(strangers[:3])}...); "
                            f"refusing to overwrite it")
        return
    if MANIFEST_NAME in names:
        raise PackError(f"{url} already holds a packed dataset; pass --overwrite to replace it")
    raise PackError(f"{url} is not empty; pass --overwrite (only fastfeed's own objects are deleted)")


def _check_not_merged(url: str, storage_options: dict | None) -> None:
    fs, base = url_to_fs(url, storage_options)
    if fs.exists(join(base, MANIFEST_NAME)):
        raise PackError(f"{url} already holds a packed dataset; a part cannot be added to it")


def _check_bucket(fs, url: str, base: str) -> None:
    """Fail before packing, not at the upload, when the bucket of an s3:// or gs:// URL does not exist."""
    problem = missing_bucket(fs, url, base)
    if problem:
        raise PackError(problem)


def _remote_names(fs, base: str) -> set[str]:
    try:
        found = fs.find(base)
    except FileNotFoundError:
        return set()
    prefix = base.rstrip("/") + "/"
    return {p[len(prefix):] if p.startswith(prefix) else p for p in found}


def _owned(rel: str) -> bool:
    top = rel.split("/", 1)[0]
    return top in OWNED_NAMES or top.startswith(("shard-", "part-"))


def _clear_remote(url: str, storage_options: dict | None, retry_timeout: float | None) -> None:
    fs, base = url_to_fs(url, storage_options)
    names = _remote_names(fs, base)
    if MANIFEST_NAME in names:  # first: from here on readers see "not a dataset", not a mix of old and new
        retrying(lambda: fs.rm_file(join(base, MANIFEST_NAME)), f"delete {url}/{MANIFEST_NAME}", retry_timeout)
    for n in sorted(names - {MANIFEST_NAME}):
        if _owned(n):
            retrying(lambda: fs.rm_file(join(base, n)), f"delete {url}/{n}", retry_timeout)


def _download_tree(url: str, dest: str, storage_options: dict | None, retry_timeout: float | None) -> None:
    fs, base = url_to_fs(url, storage_options)
    if not retrying(lambda: fs.isdir(base), f"list {url}", retry_timeout):
        raise PackError(f"{url}: a remote SRC must be a folder (ImageFolder tree or flat folder of images)")
    prefix = base.rstrip("/") + "/"
    for path in sorted(retrying(lambda: fs.find(base), f"list {url}", retry_timeout)):
        rel = path[len(prefix):] if path.startswith(prefix) else os.path.basename(path)
        target = os.path.join(dest, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        retrying(lambda: fs.get_file(path, target), f"download {url}/{rel}", retry_timeout)


def _set_source(folder: str, url: str) -> None:
    """Record the URL, not the deleted temp folder, as every manifest's source."""
    from fastfeed.pack.table import write_manifest

    for d, dirs, names in os.walk(folder):
        dirs[:] = [x for x in dirs if x != _JOURNAL]
        if MANIFEST_NAME in names:
            with open(os.path.join(d, MANIFEST_NAME), encoding="utf-8") as f:
                m = Manifest.from_json(f.read())
            write_manifest(d, replace(m, source=url))
