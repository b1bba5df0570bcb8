"""Host and GPU utilisation while a benchmark runs, sampled by one background thread.

Host numbers come from /proc (no psutil):
- `cpu_cores_busy`: CPU seconds used by this process tree (threads and live children, e.g. DataLoader workers,
  read from /proc/<pid>/stat at every sample; a child that exits between samples loses its last interval) divided
  by wall time, so 3.5 means three and a half cores kept busy on average.
- `system_cpu_busy_frac` / `iowait_frac`: from /proc/stat deltas over all CPUs of the machine, so other tenants'
  load shows up there; iowait high while throughput is low means storage is the bottleneck.
- `rss_peak_bytes`: the largest sum of proportional set sizes (PSS, /proc/<pid>/smaps_rollup; RSS where that is
  unreadable) over the process tree seen at any sample. PSS splits pages shared by forked workers, so the sum
  does not count torch's libraries once per worker.
GPU numbers come from NVML (nvidia-ml-py) when present: utilisation (% of time a kernel ran in NVML's own averaging
window), power draw in watts and the SM clock in MHz, mean and max over samples, against the board's power limit
and its highest SM clock (a GPU held below it by its power or thermal limit runs every kernel slower).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from fastfeed.world import usable_cpus

__all__ = ["SysMonitor", "HostSample", "read_proc_stat", "process_tree"]

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class HostSample:
    busy_ticks: int
    iowait_ticks: int
    total_ticks: int


def read_proc_stat(path: str = "/proc/stat") -> HostSample | None:
    """Aggregate CPU line of /proc/stat; None where it cannot be read (non-Linux)."""
    try:
        with open(path) as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    v = [int(x) for x in first[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice: already inside user/nice]
    v += [0] * (8 - len(v))
    idle, iowait = v[3], v[4]
    total = sum(v[:8])
    return HostSample(busy_ticks=total - idle - iowait, iowait_ticks=iowait, total_ticks=total)


def _children_map(proc: str) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return kids
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # exited while we looked
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(name))
    return kids


def process_tree(root: int, proc: str = "/proc") -> list[int]:
    """`root` and all its live descendants."""
    kids = _children_map(proc)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def _cpu_ticks(pid: int, proc: str) -> int | None:
    try:
        with open(f"{proc}/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14 and 15 of proc(5))


def _mem_bytes(pid: int, proc: str) -> int:
    try:
        with open(f"{proc}/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open(f"{proc}/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


class _Nvml:
    """One GPU's NVML handle, or nothing when nvidia-ml-py / a driver is missing."""

    def __init__(self, device_index: int | None):
        self.handle = None
        self.error: str | None = None
        self.limits: dict = {}  # power_limit_w, sm_clock_max_mhz, where NVML gives them
        if device_index is None:
            return
        try:
            import pynvml
        except ImportError:
            self.error = "nvidia-ml-py not installed (pip install nvidia-ml-py)"
            return
        try:
            pynvml.nvmlInit()
            self._nv = pynvml
            self.handle = self._handle(pynvml, device_index)
        except Exception as e:  # NVMLError subclasses: no driver, insufficient permissions
            self.error = f"NVML unavailable: {e}"
            return
        for name, read in (("power_limit_w", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000.0),
                           ("sm_clock_max_mhz",
                            lambda: pynvml.nvmlDeviceGetMaxClockInfo(self.handle, pynvml.NVML_CLOCK_SM))):
            try:
                self.limits[name] = float(read())
            except Exception:  # noqa: BLE001 - a board or driver that does not report it: left out
                pass

    @staticmethod
    def _handle(pynvml, index: int):
        # NVML numbers GPUs ignoring CUDA_VISIBLE_DEVICES; torch's UUID names the same physical device
        try:
            import torch

            uuid = str(torch.cuda.get_device_properties(index).uuid)
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else "GPU-" + uuid)
        except Exception:
            return pynvml.nvmlDeviceGetHandleByIndex(index)

    def sample(self) -> tuple[float, float, float | None] | None:
        """(utilisation %, power W, SM clock MHz or None), or None."""
        if self.handle is None:
            return None
        try:
            util = self._nv.nvmlDeviceGetUtilizationRates(self.handle).gpu
            power = self._nv.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
        except Exception:
            return None
        try:
            clock = float(self._nv.nvmlDeviceGetClockInfo(self.handle, self._nv.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001 - utilisation and power still tell most of it
            clock = None
        return float(util), float(power), clock


class SysMonitor:
    """Samples this process tree's CPU and memory, /proc/stat and one GPU every `interval` seconds.

    Args:
        interval: seconds between samples.
        gpu_index: CUDA device index to watch with NVML; None for no GPU numbers.
        proc: procfs root (a fake tree in tests).
    Use as a context manager or `start()`/`stop()`; `result()` after `stop()`.
    """

    def __init__(self, interval: float = 0.1, gpu_index: int | None = None, proc: str = "/proc"):
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        self.interval = interval
        self._proc = proc
        self._pid = os.getpid()
        self._nvml = _Nvml(gpu_index)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu: list[tuple[float, float, float | None]] = []
        self._rss_peak = 0
        self._cpu_first: dict[int, int] = {}
        self._cpu_last: dict[int, int] = {}

    def _sample(self) -> None:
        mem = 0
        for pid in process_tree(self._pid, self._proc):
            ticks = _cpu_ticks(pid, self._proc)
            if ticks is None:
                continue
            self._cpu_first.setdefault(pid, ticks if not self._started else 0)
            self._cpu_last[pid] = ticks
            mem += _mem_bytes(pid, self._proc)
        self._rss_peak = max(self._rss_peak, mem)
        g = self._nvml.sample()
        if g is not None:
            self._gpu.append(g)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> SysMonitor:
        self._started = False
        self._t0 = time.perf_counter()
        self._host0 = read_proc_stat(f"{self._proc}/stat")
        self._sample()  # baseline: CPU already spent by live processes is not counted
        self._started = True
        self._thread = threading.Thread(target=self._loop, name="fastfeed-sysmon", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._sample()
        self._wall = time.perf_counter() - self._t0
        self._host1 = read_proc_stat(f"{self._proc}/stat")
        self._thread = None

    def __enter__(self) -> SysMonitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def result(self) -> dict:
        """{host: {...}, gpu: {...} | None}; see the module docstring for what each number means."""
        wall = max(getattr(self, "_wall", 0.0), 1e-9)
        ticks = sum(self._cpu_last[p] - self._cpu_first.get(p, 0) for p in self._cpu_last)
        host = {
            "cpu_cores_busy": ticks / _CLK_TCK / wall,
            "cpu_count": usable_cpus(),
            "system_cpu_busy_frac": None,
            "iowait_frac": None,
            "rss_peak_bytes": int(self._rss_peak),
        }
        h0, h1 = getattr(self, "_host0", None), getattr(self, "_host1", None)
        if h0 is not None and h1 is not None and h1.total_ticks > h0.total_ticks:
            total = h1.total_ticks - h0.total_ticks
            host["system_cpu_busy_frac"] = (h1.busy_ticks - h0.busy_ticks) / total
            host["iowait_frac"] = (h1.iowait_ticks - h0.iowait_ticks) / total
        gpu = None
        if self._gpu:
            utils = [u for u, _, _ in self._gpu]
            watts = [w for _, w, _ in self._gpu]
            clocks = [c for _, _, c in self._gpu if c is not None]
            gpu = {
                "util_mean_pct": sum(utils) / len(utils),
                "util_max_pct": max(utils),
                "power_mean_w": sum(watts) / len(watts),
                "power_max_w": max(watts),
                "sm_clock_mean_mhz": sum(clocks) / len(clocks) if clocks else None,
                **self._nvml.limits,
                "samples": len(self._gpu),
            }
        return {"host": host, "gpu": gpu, "gpu_error": self._nvml.error}
