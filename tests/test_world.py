"""World resolution: explicit args > torch.distributed > torchrun's environment > 0/1/0."""
from __future__ import annotations

import dataclasses

import pytest

from fastfeed.world import World


def test_defaults_without_anything():
    assert World.resolve(environ={}) == World(0, 1, 0)
    assert World.resolve(environ={}).is_leader


def test_torchrun_environment():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert World.resolve(environ=env) == World(5, 8, 1)
    assert not World.resolve(environ=env).is_leader


def test_explicit_arguments_win_field_by_field():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    assert World.resolve(rank=2, environ=env) == World(2, 8, 1)
    assert World.resolve(rank=0, world_size=1, local_rank=0, environ=env) == World(0, 1, 0)
    assert World.resolve(local_rank=3, environ={}) == World(0, 1, 3)


def test_partial_or_malformed_environment_is_a_clear_error():
    with pytest.raises(ValueError, match="sets RANK but not WORLD_SIZE"):
        World.resolve(environ={"RANK": "1"})
    assert World.resolve(world_size=4, environ={"RANK": "1"}) == World(1, 4, 0)
    with pytest.raises(ValueError, match="WORLD_SIZE='two' is not an integer"):
        World.resolve(environ={"RANK": "0", "WORLD_SIZE": "two"})
    with pytest.raises(ValueError, match="rank must be in"):
        World.resolve(environ={"RANK": "4", "WORLD_SIZE": "4"})
    assert World.resolve(environ={"RANK": " ", "WORLD_SIZE": "", "LOCAL_RANK": ""}) == World(0, 1, 0)


@pytest.mark.parametrize("args", [(0, 0, 0), (-1, 2, 0), (2, 2, 0), (0, 1, -1), (0.0, 1, 0), (True, 2, 0)])
def test_invalid_values_raise(args):
    with pytest.raises(ValueError):
        World(*args)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        World(0, 1, 0).rank = 1  # type: ignore[misc]


def test_initialised_torch_distributed_beats_the_environment(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("this torch build has no distributed support")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "2"}
        assert World.resolve(environ=env) == World(0, 1, 2)  # local rank: torch.distributed has none
        assert World.resolve(rank=0, world_size=1, local_rank=0, environ=env) == World(0, 1, 0)
    finally:
        dist.destroy_process_group()


def test_machine_topology_comes_from_torchrun_and_the_affinity_mask():
    import os

    from fastfeed.world import usable_cpus

    w = World.resolve(environ={"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert (w.local_world_size, w.cpus) == (2, usable_cpus())
    assert w.cpus <= len(os.sched_getaffinity(0))
    assert w.cpus_per_rank == max(1, w.cpus // 2)
    assert World(cpus=16, local_world_size=8).cpus_per_rank == 2
    assert World(cpus=2, local_world_size=8).cpus_per_rank == 1
    with pytest.raises(ValueError, match="local_world_size"):
        World(local_world_size=0)


def test_usable_cpus_are_the_affinity_capped_by_a_cgroup_quota(tmp_path):
    """A container's --cpus (or a Kubernetes CPU limit) leaves every core visible and caps the time: pools sized by
    the visible cores would time-slice. The quota counts, rounded down, never below one core."""
    import os

    from fastfeed.world import usable_cpus

    mine = len(os.sched_getaffinity(0))
    f = tmp_path / "cpu.max"
    assert usable_cpus(str(tmp_path / "absent")) == mine  # no cgroup v2 controller
    for text, want in (("max 100000", mine), ("150000 100000", 1), ("50000 100000", 1),
                       (f"{(mine + 8) * 100000} 100000", mine), ("not a quota", mine)):
        f.write_text(text + "\n")
        assert usable_cpus(str(f)) == want, text
