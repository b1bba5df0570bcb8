"""StageStats: exact accounting under threads, JSON round-trip, per-period summaries."""
from __future__ import annotations

import json
import threading
import time

import pytest

from fastfeed.loader.stats import MAX_SKIP_EXAMPLES, SNAPSHOT_KEYS, STAGE_KEYS, StageStats, format_summary


def test_timed_measures_wall_time_and_counts_items():
    st = StageStats(nvtx=False)
    with st.timed("decode", n=8):
        time.sleep(0.02)
    with st.timed("decode", n=8):
        pass
    snap = st.snapshot()
    dec = snap["stages"]["decode"]
    assert dec["count"] == 16
    assert 0.02 <= dec["seconds"] < 1.0
    assert dec["max_s"] >= 0.02
    assert dec["mean_ms"] == pytest.approx(1e3 * dec["seconds"] / 16)
    assert set(snap) == set(SNAPSHOT_KEYS)
    assert set(dec) == set(STAGE_KEYS)
    # default stages are present (zeroed) so consumers of the snapshot can rely on the keys
    assert snap["stages"]["read"] == {"count": 0, "seconds": 0.0, "max_s": 0.0, "mean_ms": 0.0}


def test_timed_records_even_when_block_raises():
    st = StageStats(nvtx=False)
    with pytest.raises(ValueError):
        with st.timed("read"):
            raise ValueError("boom")
    assert st.snapshot()["stages"]["read"]["count"] == 1


def test_counters_exact_under_threads():
    st = StageStats(nvtx=False)

    def work():
        for _ in range(5000):
            st.add("samples", 1)
            st.record("wait", 1e-6)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = st.snapshot()
    assert snap["counters"]["samples"] == 20000
    assert snap["stages"]["wait"]["count"] == 20000


def test_skips_bounded_examples_and_json_roundtrip():
    st = StageStats(nvtx=False)
    for i in range(MAX_SKIP_EXAMPLES + 10):
        st.skip("decode_error", key=f"img{i}.jpg")
    st.skip("too_small", n=3)
    st.set_info("num_threads", {"reader": 4, "decoder": 2})
    snap = json.loads(json.dumps(st.snapshot()))
    assert snap["skipped"]["total"] == MAX_SKIP_EXAMPLES + 13
    assert snap["skipped"]["by_reason"] == {"decode_error": MAX_SKIP_EXAMPLES + 10, "too_small": 3}
    assert len(snap["skipped"]["examples"]) == MAX_SKIP_EXAMPLES
    assert snap["info"]["num_threads"]["reader"] == 4


def test_summary_line_since_reports_only_the_period():
    st = StageStats(nvtx=False)
    st.add("samples", 100)
    st.add("bytes_read", 5_000_000)
    st.record("decode", 2.0, 100)
    first = st.snapshot()
    st.add("samples", 7)
    st.record("decode", 0.5, 7)
    st.skip("decode_error", key="bad.jpg")
    line = st.summary_line(since=first)
    assert line.startswith("7 samples")
    assert "decode 0.50s" in line
    assert "skipped 1 (decode_error: 1)" in line
    assert "read 5.0 MB" in format_summary(first)
    assert "MB" not in line  # no bytes were read in the second period


def test_reset_keeps_info():
    st = StageStats(nvtx=False)
    st.set_info("decoder", "cpu")
    st.add("samples", 3)
    st.reset()
    snap = st.snapshot()
    assert snap["counters"] == {}
    assert snap["info"] == {"decoder": "cpu"}


def test_nvtx_true_without_cuda_raises():
    import torch

    if torch.cuda.is_available():
        assert StageStats(nvtx=True).nvtx_enabled
    else:
        with pytest.raises(RuntimeError):
            StageStats(nvtx=True)
        assert not StageStats().nvtx_enabled
