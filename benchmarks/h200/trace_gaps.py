"""Why the training stream sits idle inside a step: reads profile_step.py's kept timelines (--trace-dir) offline.

    python3 benchmarks/h200/trace_gaps.py TRACE_DIR/resnet18-ceiling TRACE_DIR/resnet18-ff TRACE_DIR/resnet18-dali

For every gap > 20 us between kernels on the training stream (CUDA stream 7, torch's default) inside a "compute"
window: if the kernel that ends the gap was launched (its cudaLaunchKernel returned) after the stream went idle,
the host was late ("late_launch_gap"), attributed to the launching thread (main = forward, the other = autograd's
backward thread); "uncovered" is the part of that lateness in which the launching thread was inside no recorded
op (interpreter time, GIL waits). Other gaps ("other_gap") are device-side waits (events, copies). Per step, ms.

    python3 trace_gaps.py --blockers TRACE ...

What the other threads were doing while a training thread sat in a slow CUDA call (a launch, copy or event call
taking over --min-us; synchronisations are waits by design and left out): for each such call, the other threads'
CUDA calls that overlap it, summed by call name and by thread. A thread that issues torch ops is marked "py" (the
loader's Python workers); the others are native (DALI's executor and decoder threads, the ring's readers).
"""
import bisect
import collections
import gzip
import json
import os
import sys


def load(name):
    return json.load(gzip.open(name + ".json.gz"))["traceEvents"]


def analyse(name):
    ev = load(name)
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == "compute" and "dur" in e)
    k7 = sorted((e["ts"], e["ts"] + e["dur"], e["args"].get("correlation")) for e in ev
                if e.get("cat") == "kernel" and e["args"].get("stream") == 7)
    rt = {e["args"].get("correlation"): e for e in ev
          if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    # per-thread sorted host events (cpu_op + cuda_runtime)
    host = collections.defaultdict(list)
    for e in ev:
        if e.get("cat") in ("cpu_op", "cuda_runtime") and "dur" in e:
            host[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for t in host:
        host[t].sort()
    res = collections.Counter()
    n = 0
    late_by_thread = collections.Counter()
    big = []
    for lo, hi in windows[1:]:
        n += 1
        ks = [k for k in k7 if k[0] >= lo and k[1] <= hi]
        prev_end = lo
        for s, e, c in ks:
            gap = s - prev_end
            if gap > 20:
                r = rt.get(c)
                # the launch returned after the stream went idle: the host was late
                if r is not None and r["ts"] + r["dur"] > prev_end:
                    res["late_launch_gap_us"] += gap
                    late_by_thread[r["tid"]] += gap
                    # what was the launching thread doing in the gap? time not covered by any host op on that thread
                    ops = [o for o in host[r["tid"]] if o[1] > prev_end and o[0] < r["ts"]]
                    covered = 0
                    last = prev_end
                    for o in ops:
                        a, b = max(o[0], last), min(o[1], r["ts"])
                        if b > a:
                            covered += b - a
                            last = max(last, b)
                    res["uncovered_us"] += max(0, (r["ts"] - prev_end) - covered)
                    if gap > 300:
                        big.append((round(gap), r["name"], r["tid"], [o[2] for o in ops[-3:]]))
                else:
                    res["other_gap_us"] += gap
            prev_end = max(prev_end, e)
        res["tail_us"] += hi - prev_end
    print(f"{name}: per step (ms): " + ", ".join(f"{k} {v / n / 1e3:.2f}" for k, v in res.items()))
    print("   late gaps by thread (ms/step):", {t: round(v / n / 1e3, 2) for t, v in late_by_thread.items()})
    big.sort(reverse=True)
    for b in big[:6]:
        print("   ", b)


def blockers(name, min_us=100.0):
    ev = load(name)
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == "compute" and "dur" in e)
    corr = {e["args"].get("correlation") for e in ev if e.get("cat") == "kernel" and e["args"].get("stream") == 7}
    # Driver-level calls (CUPTI's "cuda_driver": cuLaunchKernel of libraries that bypass the runtime, where the
    # profiler records them) count as CUDA calls too; how many the trace has is printed, so an empty category is
    # not read as "no overlap".
    cats = collections.Counter(e.get("cat") for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver"))
    calls = [(e["ts"], e["ts"] + e["dur"], e["name"], e["tid"]) for e in ev
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "dur" in e]
    train = {e["tid"] for e in ev if e.get("cat") == "cuda_runtime" and e.get("args", {}).get("correlation") in corr}
    py = {e["tid"] for e in ev if e.get("cat") == "cpu_op"}

    def inside(t):
        i = bisect.bisect_right(windows, (t, float("inf"))) - 1
        return i >= 0 and windows[i][0] <= t <= windows[i][1]

    slow = [c for c in calls if c[3] in train and c[1] - c[0] > min_us and "Synchronize" not in c[2] and inside(c[0])]
    others = sorted(c for c in calls if c[3] not in train)
    starts = [c[0] for c in others]
    longest = max((c[1] - c[0] for c in others), default=0)
    by_name, by_thread, slow_names = collections.Counter(), collections.Counter(), collections.Counter()
    for a, b, nm, _ in slow:
        slow_names[nm] += b - a
        for o in others[bisect.bisect_left(starts, a - longest):bisect.bisect_right(starts, b)]:
            ov = min(b, o[1]) - max(a, o[0])
            if ov > 0:
                kind = "py" if o[3] in py else "native"
                by_name[(o[2], kind)] += ov
                by_thread[(o[3], kind)] += ov
    n = max(1, len(windows))
    total = sum(b - a for a, b, _, _ in slow)
    print(f"{name}: CUDA calls recorded {dict(cats)}")
    print(f"{name}: {len(slow) / n:.1f} slow calls/step (> {min_us:.0f} us), {total / n / 1e3:.2f} ms/step:",
          {k: round(v / n / 1e3, 2) for k, v in slow_names.most_common(4)})
    print("   overlapped by (ms/step):", [(k, round(v / n / 1e3, 2)) for k, v in by_name.most_common(8)])
    print("   by thread (ms/step):", [(k, round(v / n / 1e3, 2)) for k, v in by_thread.most_common(6)])
    return {"calls_recorded": dict(cats), "slow_calls_per_step": len(slow) / n, "slow_ms_per_step": total / n / 1e3,
            "slow_by_name": {k: v / n / 1e3 for k, v in slow_names.items()},
            "overlapped_by": [[nm, kind, v / n / 1e3] for (nm, kind), v in by_name.most_common(20)],
            "by_thread": [[tid, kind, v / n / 1e3] for (tid, kind), v in by_thread.most_common(20)]}


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--blockers":
        out = {n: blockers(n) for n in args[1:]}
        if os.environ.get("BLOCKERS_JSON"):
            json.dump(out, open(os.environ["BLOCKERS_JSON"], "w"), indent=1)
    else:
        for n in args:
            analyse(n)
