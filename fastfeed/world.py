"""Where this process sits in a distributed job: a value object, resolved once and passed in.

Resolution order, field by field: an explicit argument wins; else `torch.distributed` when it is initialised
(rank and world size); else torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE); else
0 / 1 / 0 / 1. `cpus` is the cores this process may run on (its affinity mask), shared by the `local_world_size`
processes of its machine: `cpus_per_rank` is what a rank may budget for its own threads.
`torch.distributed` has no notion of the local rank, so that one comes from LOCAL_RANK or defaults to 0.
torch is never imported here: if the program has not imported `torch.distributed`, no process group can exist.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["World", "usable_cpus", "affinity_cpus", "cgroup_cpu_limit"]


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return value


@dataclass(frozen=True)
class World:
    """This process's rank among `world_size` processes, and its `local_rank` on its node (its GPU index).

    Args:
        rank: global index of this process, 0 <= rank < world_size.
        world_size: number of processes that together read one epoch.
        local_rank: index of this process on its machine (selects the GPU), >= 0.
        local_world_size: processes on this machine (torchrun's LOCAL_WORLD_SIZE), >= 1.
        cpus: cores this process may run on (its CPU affinity), >= 1.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    # Topology of the machine, not the position in the job: two Worlds at the same rank compare equal.
    local_world_size: int = field(default=1, compare=False)
    cpus: int = field(default=1, compare=False)

    def __post_init__(self) -> None:
        _check_int("rank", self.rank)
        _check_int("world_size", self.world_size)
        _check_int("local_rank", self.local_rank)
        _check_int("local_world_size", self.local_world_size)
        _check_int("cpus", self.cpus)
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")
        if self.local_rank < 0:
            raise ValueError(f"local_rank must be >= 0, got {self.local_rank}")
        if self.local_world_size < 1 or self.cpus < 1:
            raise ValueError(f"local_world_size and cpus must be >= 1, got {self.local_world_size}, {self.cpus}")

    @property
    def cpus_per_rank(self) -> int:
        """The share of this machine's usable cores one rank may fill with its own threads."""
        return max(1, self.cpus // self.local_world_size)

    @property
    def is_leader(self) -> bool:
        """Rank 0: the process that writes logs, reports and checkpoints."""
        return self.rank == 0

    def check_still(self, given: bool) -> None:
        """Raise RuntimeError where torch.distributed now runs another number of processes than this World was
        resolved for (`given`: world_size was passed, so it stands): a Loader built before the process group (at
        the top of a Lightning script, before Accelerator()) would read as many samples as the whole job."""
        _, size = _from_torch_distributed()
        if not given and size is not None and size != self.world_size:
            raise RuntimeError(
                f"this Loader was built for {self.world_size} process(es), but torch.distributed now runs {size}: "
                f"it was built before the process group started. Build it after (in a LightningModule's or "
                f"DataModule's train_dataloader() / val_dataloader(), after Accelerator(), after "
                f"init_process_group), or pass rank= and world_size=")

    @classmethod
    def resolve(
        cls,
        rank: int | None = None,
        world_size: int | None = None,
        local_rank: int | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> "World":
        """Build the World from explicit arguments, torch.distributed, torchrun's environment or defaults.

        `environ` defaults to `os.environ` (pass a dict to resolve for another process's environment).
        Raises ValueError for malformed environment values or an inconsistent result (e.g. RANK >= WORLD_SIZE).
        """
        env = os.environ if environ is None else environ
        dist_rank, dist_size = _from_torch_distributed()
        env_rank = _env_int(env, "RANK")
        env_size = _env_int(env, "WORLD_SIZE")
        env_local = _env_int(env, "LOCAL_RANK")
        env_local_size = _env_int(env, "LOCAL_WORLD_SIZE")
        if dist_size is None and (env_rank is None) != (env_size is None):
            present, missing = ("RANK", "WORLD_SIZE") if env_size is None else ("WORLD_SIZE", "RANK")
            if (rank if missing == "RANK" else world_size) is None:
                raise ValueError(f"the environment sets {present} but not {missing}; set both (torchrun does) "
                                 "or pass rank= and world_size= explicitly (Lightning's launcher sets WORLD_SIZE "
                                 "and LOCAL_RANK alone before it starts the process group: build the Loader in "
                                 "train_dataloader() / val_dataloader(), which run after it)")

        def pick(explicit, from_dist, from_env, default):
            for value in (explicit, from_dist, from_env):
                if value is not None:
                    return value
            return default

        try:
            return cls(
                rank=pick(rank, dist_rank, env_rank, 0),
                world_size=pick(world_size, dist_size, env_size, 1),
                local_rank=pick(local_rank, None, env_local, 0),
                local_world_size=pick(None, None, env_local_size, 1),
                cpus=usable_cpus(),
            )
        except ValueError as exc:
            raise ValueError(f"inconsistent distributed setup: {exc} (explicit args: rank={rank}, "
                             f"world_size={world_size}, local_rank={local_rank}; torch.distributed: "
                             f"{dist_rank}/{dist_size}; env RANK/WORLD_SIZE/LOCAL_RANK: "
                             f"{env_rank}/{env_size}/{env_local})") from None


CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def usable_cpus(cpu_max: str = CGROUP_CPU_MAX) -> int:
    """The cores this process can keep busy: those it may run on (affinity_cpus), and no more than a cgroup v2 CPU
    quota allows (a container's --cpus, a Kubernetes CPU limit: the cores stay visible, the time is capped),
    rounded down, at least 1. What every pool and thread count is sized from; not the machine's count."""
    n = affinity_cpus()
    quota = cgroup_cpu_limit(cpu_max)
    return max(1, min(n, int(quota))) if quota else n


def affinity_cpus() -> int:
    """The cores this process may run on (its affinity: taskset, cpusets, SLURM)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cgroup_cpu_limit(cpu_max: str = CGROUP_CPU_MAX) -> float | None:
    """CPUs allowed by a cgroup v2 quota ("max 100000" means none), or None."""
    try:
        with open(cpu_max) as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def _from_torch_distributed() -> tuple[int | None, int | None]:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None, None
    return int(dist.get_rank()), int(dist.get_world_size())
