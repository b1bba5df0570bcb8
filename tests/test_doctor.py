"""fastfeed doctor: each check fires on a faked condition built from real temp files, env dicts and limits."""
from __future__ import annotations

import json
import resource

import numpy as np
import pytest
from PIL import Image

from fastfeed.cli import main
from fastfeed.doctor.checks import (FAIL, OK, WARN, check_cpus, check_dali, check_gpu, check_manifest, check_memlock,
                             check_shm, check_small_files, check_storage, check_torchrun, cgroup_cpu_limit,
                             format_checks, run_checks, to_json)
from fastfeed.types import Manifest, ShardInfo

TORCHRUN_OK = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
               "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "NCCL_SOCKET_IFNAME": "ib0"}


def test_small_shm_warns_with_docker_fix():
    c = check_shm("/dev/shm", size=64 * 2**20)
    assert c.status == WARN and "64 MiB" in c.message and "--shm-size" in c.fix
    assert check_shm("/dev/shm", size=32 * 2**30).status == OK


def test_shm_missing_path(tmp_path):
    c = check_shm(str(tmp_path / "nope"))
    assert c.status == WARN and "not available" in c.message


def test_low_memlock_warns_and_unlimited_is_ok():
    c = check_memlock(64 * 1024, 64 * 1024)
    assert c.status == WARN and "64 KiB" in c.message and "hard limit" in c.fix and "memlock=-1" in c.fix
    assert check_memlock(resource.RLIM_INFINITY, resource.RLIM_INFINITY).status == OK
    assert check_memlock(2 << 30, 4 << 30).status == OK


def test_torchrun_consistent_env_and_nccl():
    checks = check_torchrun(TORCHRUN_OK)
    assert [c.status for c in checks] == [OK, OK]
    assert "rank 3/8" in checks[0].message


def test_torchrun_inconsistent_env_fails():
    bad_rank = check_torchrun({**TORCHRUN_OK, "RANK": "8"})
    assert bad_rank[0].status == FAIL and "RANK=8 outside" in bad_rank[0].message
    missing = check_torchrun({"RANK": "0", "WORLD_SIZE": "2"})
    assert missing[0].status == FAIL and "LOCAL_RANK" in missing[0].message and "MASTER_ADDR" in missing[0].message
    not_int = check_torchrun({**TORCHRUN_OK, "WORLD_SIZE": "eight"})
    assert not_int[0].status == FAIL and "not an integer" in not_int[0].message
    local = check_torchrun({**TORCHRUN_OK, "LOCAL_RANK": "5"})
    assert local[0].status == FAIL and "LOCAL_RANK=5" in local[0].message
    port = check_torchrun({**TORCHRUN_OK, "MASTER_PORT": "70000"})
    assert port[0].status == FAIL


def test_nccl_warnings():
    multi_node_no_iface = {k: v for k, v in TORCHRUN_OK.items() if k != "NCCL_SOCKET_IFNAME"}
    assert check_torchrun(multi_node_no_iface)[1].status == WARN
    slow = check_torchrun({**TORCHRUN_OK, "NCCL_P2P_DISABLE": "1"})[1]
    assert slow.status == WARN and "NCCL_P2P_DISABLE" in slow.fix
    assert check_torchrun({})[0].status == OK


def _fake_mounts(tmp_path, data_dir, dev, fstype):
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/root / ext4 rw 0 0\n{dev} {data_dir} {fstype} rw 0 0\n")
    return str(mounts)


def test_hdd_detected_via_sys_block(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    sys_block = tmp_path / "sys_block"
    (sys_block / "sdb" / "queue").mkdir(parents=True)
    (sys_block / "sdb" / "queue" / "rotational").write_text("1\n")
    c = check_storage(str(data / "sub"), _fake_mounts(tmp_path, data, "/dev/sdb1", "ext4"), str(sys_block))
    assert c.status == WARN and "rotational" in c.message and "/dev/sdb1" in c.message
    (sys_block / "sdb" / "queue" / "rotational").write_text("0\n")
    ok = check_storage(str(data), _fake_mounts(tmp_path, data, "/dev/sdb1", "ext4"), str(sys_block))
    assert ok.status == OK and "SSD" in ok.message


def test_nvme_partition_name_maps_to_disk(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    sys_block = tmp_path / "sys_block"
    (sys_block / "nvme0n1" / "queue").mkdir(parents=True)
    (sys_block / "nvme0n1" / "queue" / "rotational").write_text("0\n")
    c = check_storage(str(data), _fake_mounts(tmp_path, data, "/dev/nvme0n1p2", "xfs"), str(sys_block))
    assert c.status == OK and "SSD/NVMe" in c.message


def test_network_filesystems_warn(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for fstype in ("nfs4", "cifs", "fuse.s3fs", "lustre"):
        c = check_storage(str(data), _fake_mounts(tmp_path, data, "server:/export", fstype), str(tmp_path))
        assert c.status == WARN and fstype in c.message and "fastfeed pack" in c.fix


def _jpeg_bytes() -> bytes:
    import io

    buf = io.BytesIO()
    Image.fromarray(np.full((16, 16, 3), 120, np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def test_unpacked_small_files_suggests_pack(tmp_path):
    src = tmp_path / "imgs"
    data = _jpeg_bytes()
    for i in range(12):
        (src / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        (src / f"c{i % 3}" / f"{i}.jpg").write_bytes(data)
    c = check_small_files(str(src), min_count=10)
    assert c.status == WARN and "12 image files" in c.message and "starves" in c.message
    assert c.fix == f"fastfeed pack {src} {src}-packed"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check_small_files(str(empty)).status == FAIL


def _write_packed(root, jpeg_mix, shard_bytes=b"x" * 100, recorded=100):
    root.mkdir()
    (root / "shard-000000.tar").write_bytes(shard_bytes)
    np.savez(root / "samples.npz", label=np.zeros(2, np.int64))
    man = Manifest(kind="wds", num_samples=2, classes=["a"], class_to_idx={"a": 0},
                   shards=[ShardInfo("shard-000000.tar", recorded, "0" * 64, 2)], image_stats={},
                   jpeg_mix=jpeg_mix, transcoded=0, rejected=0, source="/nowhere", source_kind="folder", options={})
    (root / "fastfeed.json").write_text(man.to_json())


def test_packed_manifest_health_and_jpeg_mix(tmp_path):
    good = tmp_path / "good"
    _write_packed(good, {"baseline": 2})
    assert check_small_files(str(good)) is None
    assert [c.status for c in check_manifest(str(good))] == [OK, OK]

    prog = tmp_path / "prog"
    _write_packed(prog, {"baseline": 1, "progressive": 1})
    man, mix = check_manifest(str(prog))
    assert man.status == OK and mix.status == WARN and "--jpeg baseline" in mix.fix

    broken = tmp_path / "broken"
    _write_packed(broken, {"baseline": 2}, recorded=999)
    c = check_manifest(str(broken))[0]
    assert c.status == FAIL and "manifest says 999" in c.message

    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "fastfeed.json").write_text("{not json")
    assert check_manifest(str(garbage))[0].status == FAIL


def test_dali_driver_mismatch():
    assert check_dali("2.4.0", 13, (12, 4)).status == FAIL
    assert "dali-cuda12" in check_dali("2.4.0", 13, (12, 4)).fix
    assert check_dali("2.4.0", 12, (13, 0)).status == OK
    assert check_dali("2.4.0", 13, None).status == OK
    assert check_dali(None, None, (13, 0), "ImportError: no module").status == WARN


def test_cpus_and_gpu():
    over = check_cpus(usable=2, online=64, requested=8)
    assert over.status == WARN and "--num-threads 2" in over.fix
    assert check_cpus(usable=32, online=64, requested=8).status == OK
    assert check_cpus(usable=32, online=64, quota=4.0, requested=8).status == WARN
    assert check_gpu(["NVIDIA H200"]).status == OK
    assert "CUDA_VISIBLE_DEVICES" in check_gpu([], visible_env="").message


def test_cgroup_quota(tmp_path):
    f = tmp_path / "cpu.max"
    f.write_text("250000 100000\n")
    assert cgroup_cpu_limit(str(f)) == 2.5
    f.write_text("max 100000\n")
    assert cgroup_cpu_limit(str(f)) is None


def test_run_checks_and_cli_exit_status(tmp_path, capsys):
    checks = run_checks(str(tmp_path / "missing"), env={})
    assert any(c.status == FAIL for c in checks)
    doc = json.loads(to_json(checks))
    assert doc["ok"] is False and {"name", "status", "message", "fix"} == set(doc["checks"][0])
    assert len(format_checks(checks).splitlines()) == len(checks)  # one line per check
    assert main(["doctor", str(tmp_path / "missing")]) == 1
    capsys.readouterr()
    assert main(["doctor", "--json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["schema_version"] == 1


def _sys_disk(sys_block, name, rotational, vendor=None):
    q = sys_block / name / "queue"
    q.mkdir(parents=True)
    (q / "rotational").write_text(f"{rotational}\n")
    if vendor is not None:
        (sys_block / name / "device").mkdir()
        (sys_block / name / "device" / "vendor").write_text(f"{vendor}\n")


def test_virtual_disk_rotational_flag_is_not_evidence(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    sys_block = tmp_path / "sys_block"
    _sys_disk(sys_block, "vda", 1)  # virtio-blk reports rotational=1 whatever backs it
    c = check_storage(str(data), _fake_mounts(tmp_path, data, "/dev/vda1", "ext4"), str(sys_block))
    assert c.status == OK and "virtual disk (virtio" in c.message and "pack" not in c.message
    _sys_disk(sys_block, "sdc", 1, vendor="QEMU")  # an emulated SCSI disk
    c = check_storage(str(data), _fake_mounts(tmp_path, data, "/dev/sdc1", "ext4"), str(sys_block))
    assert c.status == OK and "virtual disk (Qemu" in c.message
    _sys_disk(sys_block, "sdd", 1, vendor="ATA")  # a real spinning disk still warns
    assert check_storage(str(data), _fake_mounts(tmp_path, data, "/dev/sdd1", "ext4"), str(sys_block)).status == WARN


def test_storage_fix_for_a_packed_dataset_does_not_say_pack_it(tmp_path):
    packed = tmp_path / "packed"
    _write_packed(packed, {"baseline": 2})
    sys_block = tmp_path / "sys_block"
    _sys_disk(sys_block, "sdb", 1)
    c = check_storage(str(packed), _fake_mounts(tmp_path, packed, "/dev/sdb1", "ext4"), str(sys_block))
    assert c.status == WARN and "fastfeed pack" not in c.fix and "page cache" in c.fix
    c = check_storage(str(packed), _fake_mounts(tmp_path, packed, "server:/x", "nfs4"), str(sys_block))
    assert c.status == WARN and "fastfeed pack" not in c.fix and "reader" in c.fix


def test_without_a_gpu_gpu_only_advice_is_not_given(tmp_path):
    prog = tmp_path / "prog"
    _write_packed(prog, {"baseline": 1, "progressive": 1})
    man, mix = check_manifest(str(prog), gpu=False)
    assert mix.status == OK and "no GPU" in mix.message
    assert check_memlock(64 * 1024, 64 * 1024, gpu=False).status == OK
    c = check_cpus(usable=2, online=2, gpu=False)
    assert "dali" not in c.fix and "more CPUs" in c.fix


def test_doctor_on_a_packed_dataset_never_suggests_packing_it(packed, capsys):
    for path in packed.values():
        assert main(["doctor", str(path)]) in (0, 1)
        out = capsys.readouterr().out
        assert "fastfeed pack" not in out, out


def test_read_probe_measures_direct_reads(tmp_path):
    import os

    from fastfeed.doctor.checks import read_probe

    (tmp_path / "shard-000000.tar").write_bytes(os.urandom(4 << 20))
    probe = read_probe(str(tmp_path), reads=8)
    try:  # tmpfs and some filesystems refuse O_DIRECT: then there is no evidence, and None says so
        os.close(os.open(tmp_path / "shard-000000.tar", os.O_RDONLY | os.O_DIRECT))
    except OSError:
        assert probe is None
        return
    assert probe["reads"] == 8 and probe["block"] == 1 << 20
    assert probe["mb_per_s"] > 0 and probe["p50_ms"] >= 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert read_probe(str(empty)) is None


def test_virtual_disk_warns_only_on_measured_slowness(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    sys_block = tmp_path / "sys_block"
    _sys_disk(sys_block, "vda", 1)
    mounts = _fake_mounts(tmp_path, data, "/dev/vda1", "ext4")
    fast = {"reads": 32, "block": 1 << 20, "mb_per_s": 900.0, "p50_ms": 1.1}
    c = check_storage(str(data), mounts, str(sys_block), probe=fast)
    assert c.status == OK and "900 MB/s" in c.message
    slow = {**fast, "mb_per_s": 12.0, "p50_ms": 80.0}
    c = check_storage(str(data), mounts, str(sys_block), probe=slow)
    assert c.status == WARN and "measured slow" in c.message and "12 MB/s" in c.message


@pytest.mark.parametrize("env, expected", [(None, 10.0), ("3", 3.0), ("60", 10.0)])
def test_doctor_on_a_url_waits_no_longer_than_the_retry_timeout_asked_for(monkeypatch, env, expected):
    """Found by an adversarial run: doctor kept its own 10 s bound on a dead endpoint whatever
    FASTFEED_RETRY_TIMEOUT said; it now takes the shorter of the two."""
    from fastfeed.doctor import remote
    from fastfeed.types import DatasetError

    seen = []

    def read_manifest(url, storage_options=None, retry_timeout=None):
        seen.append(retry_timeout)
        raise DatasetError(f"{url}: unreachable")

    if env is None:
        monkeypatch.delenv("FASTFEED_RETRY_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("FASTFEED_RETRY_TIMEOUT", env)
    monkeypatch.setattr(remote, "read_manifest", read_manifest)
    (check,) = remote.check_remote("s3://nowhere/ds")
    assert seen == [expected] and "unreachable" in check.message
