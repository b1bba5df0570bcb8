"""`fastfeed doctor`: checks of this machine and a dataset, each one line OK / WARN / FAIL with the concrete fix.

Every check is a small function whose inputs are parameters (file paths such as /proc/mounts and /sys/block, an
environment mapping, rlimit values, versions), so tests fake each condition with real temporary files.
`run_checks()` gathers the real inputs and calls them. Nothing here imports torch or DALI at module import: a broken
CUDA install must still get a report.
"""
from __future__ import annotations

import json
import os
import re
import resource
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path

from fastfeed.doctor.check import FAIL, OK, WARN, Check, gib
from fastfeed.doctor.readprobe import SLOW_DIRECT_MB_S, read_probe
from fastfeed.doctor.remote import check_remote
from fastfeed.formats.base import remote_shards, shard_root
from fastfeed.remote.store import is_url
from fastfeed.world import affinity_cpus, cgroup_cpu_limit

__all__ = [
    "Check", "OK", "WARN", "FAIL", "DOCTOR_SCHEMA_VERSION",
    "check_dali", "check_gpu", "check_memlock", "check_shm", "check_cpus", "check_storage", "check_small_files",
    "read_probe", "SLOW_DIRECT_MB_S",
    "check_manifest", "check_torchrun", "run_checks", "format_checks", "to_json",
]

DOCTOR_SCHEMA_VERSION = 1
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p",
              "afs", "panfs", "wekafs", "virtiofs"}
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
MEMLOCK_WANTED = 1 << 30     # pinned staging + NCCL/IB registration want far more than the common 64 KiB-8 MiB
SHM_WANTED = 1 << 30         # docker's default is 64 MiB: DataLoader workers and NCCL die with "Bus error"
SMALL_FILE_BYTES = 1 << 20   # below this, per-file open/seek cost dominates reading
SMALL_FILE_COUNT = 1000


# ------------------------------------------------------------------------------------------------ GPU and DALI
def check_dali(dali_version: str | None, dali_cuda_major: int | None, driver_cuda: tuple[int, int] | None,
               import_error: str | None = None) -> Check:
    """DALI importable, and built for a CUDA major the installed driver supports (driver_cuda from NVML)."""
    def wheel_for(major: int) -> str:
        return f"pip install 'fastfeed[dali-cuda{major}]'" if major in (12, 13) else \
            f"pip install nvidia-dali-cuda{major}0"
    if dali_version is None:
        fix = wheel_for(driver_cuda[0]) if driver_cuda else "pip install 'fastfeed[dali-cuda13]' (or dali-cuda12)"
        return Check("dali", WARN, f"DALI not importable ({import_error or 'not installed'}); GPU decode is off, "
                     "the CPU decode path will be used", fix)
    if driver_cuda is None:
        return Check("dali", OK, f"DALI {dali_version} importable (no NVIDIA driver: CPU pipelines only)")
    if dali_cuda_major is None:
        return Check("dali", WARN, f"DALI {dali_version}: cannot tell which CUDA it was built for",
                     f"install the wheel matching the driver: {wheel_for(driver_cuda[0])}")
    if dali_cuda_major > driver_cuda[0]:
        return Check("dali", FAIL, f"DALI {dali_version} is built for CUDA {dali_cuda_major} but the driver supports "
                     f"CUDA {driver_cuda[0]}.{driver_cuda[1]}: GPU pipelines will fail to start",
                     f"pip uninstall nvidia-dali-cuda{dali_cuda_major}0 && {wheel_for(driver_cuda[0])}, or upgrade "
                     "the NVIDIA driver")
    return Check("dali", OK, f"DALI {dali_version} (CUDA {dali_cuda_major}) runs on this driver "
                 f"(CUDA {driver_cuda[0]}.{driver_cuda[1]})")


def check_gpu(device_names: list[str], error: str | None = None, visible_env: str | None = None) -> Check:
    if device_names:
        return Check("gpu", OK, f"{len(device_names)} CUDA GPU(s): {', '.join(device_names)}")
    why = f" ({error})" if error else ""
    if visible_env is not None and visible_env.strip() in ("", "-1", "none", "NoDevFiles"):
        return Check("gpu", WARN, f"no CUDA GPU visible: CUDA_VISIBLE_DEVICES={visible_env!r}{why}",
                     "unset CUDA_VISIBLE_DEVICES or list the GPU indices to use")
    return Check("gpu", WARN, f"no CUDA GPU visible{why}; fastfeed will decode on the CPU",
                 "in a container run with `--gpus all` (docker) and check `nvidia-smi` works")


# ------------------------------------------------------------------------------------------------ host limits
def check_memlock(soft: int, hard: int, wanted: int = MEMLOCK_WANTED, gpu: bool = True) -> Check:
    """RLIMIT_MEMLOCK (`ulimit -l`), in bytes; resource.RLIM_INFINITY means unlimited. Only GPUs use pinned memory."""
    shown = "unlimited" if soft == resource.RLIM_INFINITY else (gib(soft) if soft >= 2**20 else f"{soft // 1024} KiB")
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return Check("memlock", OK, f"page-locked memory limit {shown}")
    if not gpu:
        return Check("memlock", OK, f"page-locked memory limit {shown} (no GPU here: nothing is pinned)")
    fix = ("ulimit -l unlimited (raise the hard limit in /etc/security/limits.conf: '* - memlock unlimited'); "
           "docker: --ulimit memlock=-1:-1")
    if hard != resource.RLIM_INFINITY and hard < wanted:
        fix = "hard limit too low: " + fix
    return Check("memlock", WARN, f"page-locked memory limit is {shown}"
                 f" (< {gib(wanted)}): pinning and NCCL/InfiniBand registration may fail or fall back to pageable "
                 "copies", fix)


def check_shm(path: str = "/dev/shm", size: int | None = None, wanted: int = SHM_WANTED) -> Check:
    """Size of the shared-memory tmpfs; `size` (bytes) is measured with statvfs when not given."""
    if size is None:
        try:
            st = os.statvfs(path)
        except OSError as e:
            return Check("shm", WARN, f"{path} not available ({e.strerror}): DataLoader workers and NCCL need it",
                         "mount a tmpfs at /dev/shm; docker: --shm-size=16g or --ipc=host")
        size = st.f_blocks * st.f_frsize
    if size < wanted:
        return Check("shm", WARN, f"{path} is only {gib(size)}: torch DataLoader workers and NCCL fail with "
                     "'Bus error' / 'No space left on device'", "docker: --shm-size=16g (or --ipc=host); "
                     "kubernetes: mount an emptyDir with medium: Memory at /dev/shm")
    return Check("shm", OK, f"{path} is {gib(size)}")


def check_cpus(usable: int, online: int, requested: int | None = None, quota: float | None = None,
               gpu: bool = True) -> Check:
    """usable = len(os.sched_getaffinity(0)); quota from cgroup_cpu_limit(); requested = --num-threads."""
    limit = min(usable, quota) if quota else usable
    desc = f"{usable} usable CPU(s) of {online}" + (f", cgroup quota {quota:g} CPUs" if quota else "")
    if requested is not None and requested > limit:
        return Check("cpus", WARN, f"{requested} threads requested but {desc}: threads will time-slice",
                     f"use --num-threads {max(1, int(limit))} (or 'auto')")
    if limit < 4:
        if not gpu:
            return Check("cpus", WARN, f"{desc}: CPU decoding, the only path without a GPU, runs on these",
                         "request more CPUs for this job")
        return Check("cpus", WARN, f"{desc}: too few for CPU decoding at GPU speed",
                     "use GPU decode (decoder='dali') or request more CPUs for this job")
    return Check("cpus", OK, desc)


# ------------------------------------------------------------------------------------------------ storage
def mount_for(path: str, mounts: str = "/proc/mounts") -> tuple[str, str, str] | None:
    """(device, mount point, fs type) of the mount holding `path` (longest mount-point prefix)."""
    real = os.path.realpath(path)
    best = None
    try:
        with open(mounts) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                dev, mnt, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
                if real == mnt or real.startswith(mnt.rstrip("/") + "/") or mnt == "/":
                    if best is None or len(mnt) >= len(best[1]):
                        best = (dev, mnt, fstype)
    except OSError:
        return None
    return best


_VIRTUAL_VENDORS = ("QEMU", "VMWARE", "MSFT", "GOOGLE", "AMAZON", "XEN", "VBOX", "VIRTUAL")


def _disk(dev: str, sys_block: str) -> tuple[str, bool | None, str | None]:
    """(disk name, rotational flag or None, why it is a virtual disk or None) for a /dev partition or disk."""
    name = os.path.basename(dev)
    candidates = [name, re.sub(r"p\d+$", "", name) if re.search(r"\d+p\d+$", name) else re.sub(r"\d+$", "", name)]
    for c in candidates:
        queue = Path(sys_block, c, "queue", "rotational")
        try:
            rot = queue.read_text().strip() == "1"
        except OSError:
            continue
        return c, rot, _virtual(c, Path(sys_block, c))
    return name, None, None


def _virtual(name: str, block: Path) -> str | None:
    """Why `name` is a hypervisor's disk, whose rotational flag describes nothing real; None if it looks physical."""
    if name.startswith(("vd", "xvd")):
        return "virtio" if name.startswith("vd") else "Xen"
    if "virtio" in os.path.realpath(block):
        return "virtio"
    try:
        vendor = (block / "device" / "vendor").read_text().strip().upper()
    except OSError:
        return None
    return vendor.title() if vendor.startswith(_VIRTUAL_VENDORS) else None


def _measured(probe: dict | None) -> str:
    if not probe:
        return ""
    return (f"; {probe['reads']} random {probe['block'] // 1024} KiB direct reads: {probe['mb_per_s']:.0f} MB/s, "
            f"p50 {probe['p50_ms']:.1f} ms")


def check_storage(path: str, mounts: str = "/proc/mounts", sys_block: str = "/sys/block",
                  probe: dict | None = None) -> Check:
    """The filesystem under `path`: network and rotational disks warn; a virtual disk's flag is not evidence.

    A hypervisor's disk (virtio /dev/vda, Xen, a cloud's emulated SCSI) commonly reports rotational=1 whatever
    backs it, so only a measurement counts there: `probe` (from `read_probe`) warns when direct reads are slow.
    The fix depends on whether `path` is already packed: packing a packed dataset again changes nothing.
    """
    m = mount_for(path, mounts)
    if m is None:
        return Check("storage", WARN, f"cannot tell which filesystem holds {path}")
    dev, mnt, fstype = m
    packed = (Path(path) / "fastfeed.json").is_file()
    measured = _measured(probe)
    if fstype in NETWORK_FS or fstype.startswith("fuse."):
        fix = ("raise the Loader's reader_threads, use order='shard' for sequential reads, or copy the dataset to "
               "local NVMe before training") if packed else \
            ("pack into shards (`fastfeed pack`), raise reader threads, or copy the packed dataset to local NVMe "
             "before training")
        return Check("storage", WARN, f"{path} is on a network filesystem ({fstype} at {mnt}): per-file latency "
                     f"dominates small reads{measured}", fix)
    if not dev.startswith("/dev/"):
        return Check("storage", OK, f"{path} on {fstype} ({dev} at {mnt}){measured}")
    disk, rot, virtual = _disk(dev, sys_block)
    slow_fix = ("keep the dataset in the page cache (enough RAM: it is read once, then served from memory) or on "
                "a faster volume; order='shard' makes reads sequential") if packed else \
        "pack into shards (`fastfeed pack`: large sequential reads) and keep the dataset on SSD or in page cache"
    if virtual:
        what = f"{path} on a virtual disk ({virtual}, {dev} at {mnt})"
        if probe and probe["mb_per_s"] < SLOW_DIRECT_MB_S:
            return Check("storage", WARN, f"{what}: measured slow{measured}", slow_fix)
        note = "" if probe else "; its rotational flag says nothing about the storage behind it (not measured)"
        return Check("storage", OK, what + (measured or note))
    if rot:
        return Check("storage", WARN, f"{path} is on a rotational disk ({dev}): random reads cost a seek each"
                     f"{measured}", slow_fix)
    kind = "SSD/NVMe" if rot is False else fstype
    return Check("storage", OK, f"{path} on {kind} ({dev} at {mnt}){measured}")


def check_small_files(path: str, max_scan: int = 20000, min_count: int = SMALL_FILE_COUNT,
                      max_entries: int = 200000) -> Check | None:
    """A raw folder of many small image files (not a packed dataset): suggest `fastfeed pack`. None if packed."""
    root = Path(path)
    if (root / "fastfeed.json").exists():
        return None
    count, total, seen = 0, 0, 0
    for dirpath, _, files in os.walk(root):
        seen += len(files)
        for fn in files:
            if os.path.splitext(fn)[1].lower() in IMAGE_SUFFIXES:
                try:
                    total += os.stat(os.path.join(dirpath, fn)).st_size
                except OSError:
                    continue
                count += 1
        if count >= max_scan or seen >= max_entries:  # bounded: doctor must answer fast on a huge tree
            break
    if count == 0:
        return Check("dataset", FAIL, f"{path} is neither a packed dataset (no fastfeed.json) nor an image folder",
                     "point at the output folder of `fastfeed pack`")
    mean = total / count
    more = "+" if count >= max_scan or seen >= max_entries else ""
    msg = f"{path} is an unpacked folder of {count}{more} image files (mean {mean / 1024:.0f} KiB)"
    cmd = f"fastfeed pack {path} {str(root).rstrip('/')}-packed"
    if count >= min_count and mean < SMALL_FILE_BYTES:
        return Check("dataset", WARN, msg + ": one open+read per sample starves the GPU", cmd)
    return Check("dataset", WARN, msg + "; fastfeed.Loader reads packed datasets", cmd)


def _shards_at_url(path: str) -> bool:
    """A local dataset folder whose shards are at a URL (`fastfeed index` of shards at a URL)."""
    from fastfeed.types import Manifest

    try:
        man = Manifest.from_json((Path(path) / "fastfeed.json").read_text(), where=path)
    except Exception:  # noqa: BLE001 - no or no readable manifest: the local checks say what is wrong
        return False
    return remote_shards(man)


def check_manifest(path: str, gpu: bool = True) -> list[Check]:
    """A packed dataset: manifest readable, shard files present with the recorded sizes, JPEG mix advice.

    gpu: whether a CUDA GPU is visible; the JPEG mix matters only for the GPU's hardware decoder, so without one
    there is nothing to re-pack for.
    """
    from fastfeed.types import Manifest  # no torch; raises DatasetError on a bad manifest

    root = Path(path)
    try:
        man = Manifest.from_json((root / "fastfeed.json").read_text(), where=str(root / "fastfeed.json"))
    except Exception as e:  # DatasetError, OSError, UnicodeDecodeError: all mean "unreadable manifest"
        return [Check("manifest", FAIL, str(e), "re-pack the dataset with this fastfeed version")]
    out = []
    problems = []
    shards = Path(shard_root(str(root), man))  # the shards' folder: elsewhere when `fastfeed index` said so
    for sh in man.shards:
        p = shards / sh.path
        try:
            size = p.stat().st_size if p.is_file() else None
        except OSError:
            size = None
        if size is None:
            problems.append(f"{sh.path} missing")
        elif size != sh.bytes:
            problems.append(f"{sh.path} is {size} bytes, manifest says {sh.bytes}")
    if not (root / "samples.npz").is_file():
        problems.append("samples.npz missing")
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        out.append(Check("manifest", FAIL, f"{man.num_samples} samples, {man.kind}: {shown}",
                         f"`fastfeed verify {path}` for details; re-pack or re-copy the dataset"))
    else:
        when = "indexed" if man.source_kind == "shards" else "packed"
        note = f", {man.rejected} source files rejected when {when}" if man.rejected else ""
        out.append(Check("manifest", OK, f"{man.num_samples} samples, {len(man.classes)} classes, {man.kind}, "
                         f"{len(man.shards)} shard(s){note}"))
    if not gpu:
        out.append(Check("jpeg_mix", OK, "no GPU here: the JPEG mix matters only for a GPU's hardware decoder"))
        return out
    try:
        from fastfeed.image.transcode import hw_decoder_advice

        advice = hw_decoder_advice(man.jpeg_mix)
    except ValueError as e:
        out.append(Check("jpeg_mix", WARN, f"manifest jpeg_mix unreadable ({e})"))
    else:
        if advice:
            first, *rest = advice.splitlines()
            out.append(Check("jpeg_mix", WARN, first, " ".join(s.strip() for s in rest)))
        else:
            out.append(Check("jpeg_mix", OK, "images suit the GPU hardware JPEG decoder"))
    return out


# ------------------------------------------------------------------------------------------------ torchrun / NCCL
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def check_torchrun(env: Mapping[str, str]) -> list[Check]:
    """Under torchrun (any of its variables set): the set is complete and consistent; NCCL settings are sane."""
    if not any(k in env for k in (*_TORCHRUN_VARS, "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")):
        return [Check("torchrun", OK, "not launched by torchrun (single process)")]
    missing = [k for k in _TORCHRUN_VARS if not env.get(k)]
    if missing:
        return [Check("torchrun", FAIL, f"torchrun-style launch but {', '.join(missing)} unset",
                      "launch with `torchrun --nproc-per-node N train.py` or export all of "
                      + ", ".join(_TORCHRUN_VARS))]
    ints = {}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        if k in env:
            try:
                ints[k] = int(env[k])
            except ValueError:
                return [Check("torchrun", FAIL, f"{k}={env[k]!r} is not an integer", f"export {k} as an integer")]
    rank, world, local = ints["RANK"], ints["WORLD_SIZE"], ints["LOCAL_RANK"]
    errors = []
    if world < 1:
        errors.append(f"WORLD_SIZE={world} < 1")
    if not 0 <= rank < max(world, 1):
        errors.append(f"RANK={rank} outside [0, WORLD_SIZE={world})")
    lws = ints.get("LOCAL_WORLD_SIZE")
    if lws is not None and (not 0 <= local < lws or lws > world):
        errors.append(f"LOCAL_RANK={local} / LOCAL_WORLD_SIZE={lws} inconsistent with WORLD_SIZE={world}")
    if local < 0 or local > rank:
        errors.append(f"LOCAL_RANK={local} must be in [0, RANK={rank}]")
    if not 1 <= ints["MASTER_PORT"] <= 65535:
        errors.append(f"MASTER_PORT={ints['MASTER_PORT']} outside 1..65535")
    if errors:
        return [Check("torchrun", FAIL, "; ".join(errors), "let torchrun set these (do not export them by hand)")]
    out = [Check("torchrun", OK, f"rank {rank}/{world}, local rank {local}, master "
                 f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}")]
    nccl = {k: v for k, v in env.items() if k.startswith("NCCL_")}
    multi_node = lws is not None and world > lws
    slow = [k for k in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE", "NCCL_SHM_DISABLE") if nccl.get(k) == "1"]
    if slow:
        out.append(Check("nccl", WARN, f"{', '.join(slow)}=1 forces slower transports",
                         f"unset {' '.join(slow)} unless a known hardware problem needs it"))
    elif multi_node and "NCCL_SOCKET_IFNAME" not in nccl:
        out.append(Check("nccl", WARN, "multi-node run without NCCL_SOCKET_IFNAME: NCCL may pick a wrong (docker/"
                         "loopback) interface", "export NCCL_SOCKET_IFNAME=<interface of the cluster network>"))
    else:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(nccl.items())) or "defaults"
        out.append(Check("nccl", OK, f"NCCL settings: {shown}"))
    return out


# ------------------------------------------------------------------------------------------------ gathering
def _dali_facts() -> tuple[str | None, int | None, str | None]:
    try:
        import nvidia.dali as dali
    except Exception as e:  # ImportError, or an OSError from a missing CUDA library
        return None, None, f"{type(e).__name__}: {e}"
    from importlib import metadata

    major = None
    for dist in metadata.distributions():
        m = re.fullmatch(r"nvidia[-_]dali[-_]cuda(\d+)", (dist.metadata["Name"] or "").lower())
        if m:
            major = int(m.group(1)) // 10
            break
    return getattr(dali, "__version__", "?"), major, None


def _driver_cuda() -> tuple[tuple[int, int] | None, str | None]:
    try:
        import pynvml

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetCudaDriverVersion()
        return (v // 1000, (v % 1000) // 10), None
    except Exception as e:  # no nvidia-ml-py, no driver, or no GPU: all mean "no driver CUDA version"
        return None, str(e) or type(e).__name__


def _gpus() -> tuple[list[str], str | None]:
    try:
        import torch

        if not torch.cuda.is_available():
            return [], None
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], None
    except Exception as e:  # a broken CUDA install must not stop the other checks
        return [], f"{type(e).__name__}: {e}"


def run_checks(dataset: str | None = None, num_threads: int | None = None,
               env: Mapping[str, str] | None = None) -> list[Check]:
    env = os.environ if env is None else env
    version, major, err = _dali_facts()
    driver, _ = _driver_cuda()
    names, gpu_err = _gpus()
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    usable = affinity_cpus()  # the quota is reported beside it
    checks = [
        check_dali(version, major, driver, err),
        check_gpu(names, gpu_err, env.get("CUDA_VISIBLE_DEVICES")),
        check_memlock(soft, hard, gpu=bool(names)),
        check_shm(),
        check_cpus(usable, os.cpu_count() or usable, num_threads, cgroup_cpu_limit(), gpu=bool(names)),
    ]
    if dataset is not None:
        if is_url(dataset) or _shards_at_url(dataset):
            checks.extend(check_remote(dataset))
        elif not os.path.exists(dataset):
            checks.append(Check("dataset", FAIL, f"{dataset} does not exist", "check the path"))
        else:
            checks.append(check_storage(dataset, probe=read_probe(dataset)))
            small = check_small_files(dataset)
            checks.extend([small] if small is not None else check_manifest(dataset, gpu=bool(names)))
    checks.extend(check_torchrun(env))
    return checks


def format_checks(checks: list[Check]) -> str:
    lines = []
    for c in checks:
        line = f"{c.status:<4}  {c.name:<9} {c.message}"
        if c.fix and c.status != OK:
            line += f"  -> fix: {c.fix}"
        lines.append(line)
    return "\n".join(lines)


def to_json(checks: list[Check]) -> str:
    doc = {"schema_version": DOCTOR_SCHEMA_VERSION, "ok": all(c.status != FAIL for c in checks),
           "checks": [asdict(c) for c in checks]}
    return json.dumps(doc, indent=2)
