"""A Loader built before the job's process group starts (at the top of a script that Lightning or Accelerate then
launches, or before init_process_group) resolved a world of one process and would read every sample on every rank:
its first iteration refuses, on each rank, saying where to build it. Real processes (torch.multiprocessing, gloo)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from clients.common import free_port

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import fastfeed

    def rank_main(rank, data, port, out):
        early = fastfeed.Loader(data, batch_size=4, device="cpu")  # before the group: a world of one
        explicit = fastfeed.Loader(data, batch_size=4, device="cpu", rank=rank, world_size=2)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        report = {"early_world": early.world.world_size}
        try:
            next(iter(early))
        except RuntimeError as e:
            report["refused"] = str(e)
        report["explicit_len"] = len(explicit)
        report["explicit_first"] = next(iter(explicit))[1].tolist()
        late = fastfeed.Loader(data, batch_size=4, device="cpu")  # after it: the group's world
        report["late_world"] = [late.world.rank, late.world.world_size]
        for loader in (early, explicit, late):
            loader.close()
        dist.destroy_process_group()
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(report, f)

    if __name__ == "__main__":
        mp.spawn(rank_main, args=(sys.argv[1], int(sys.argv[2]), sys.argv[3]), nprocs=2)
""")


def test_a_loader_built_before_the_process_group_refuses_to_iterate_on_every_rank(wds_path, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    script = tmp_path / "late_group.py"  # a file: spawned processes import their function from it
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(wds_path), str(free_port()), str(tmp_path)],
                          capture_output=True, text=True, timeout=240, env=dict(env, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, r in enumerate(reports):
        assert r["early_world"] == 1 and r["late_world"] == [rank, 2]
        assert "built for 1 process(es), but torch.distributed now runs 2" in r["refused"]
        assert "train_dataloader()" in r["refused"] and "world_size=" in r["refused"]
    # a world passed explicitly stands: each rank reads its own half
    assert reports[0]["explicit_len"] == reports[1]["explicit_len"]
    assert reports[0]["explicit_first"] != reports[1]["explicit_first"]
