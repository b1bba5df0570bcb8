"""Why the training stream sits idle inside a step: reads profile_step.py's kept timelines (--trace-dir) offline.

    python3 benchmarks/h200/trace_gaps.py TRACE_DIR/resnet18-ceiling TRACE_DIR/resnet18-ff TRACE_DIR/resnet18-dali

For every gap > 20 us between kernels on the training stream (CUDA stream 7, torch's default) inside a "compute"
window: if the kernel that ends the gap was launched (its cudaLaunchKernel returned) after the stream went idle,
the host was late ("late_launch_gap"), attributed to the launching thread (main = forward, the other = autograd's
backward thread); "uncovered" is the part of that lateness in which the launching thread was inside no recorded
op (interpreter time, GIL waits). Other gaps ("other_gap") are device-side waits (events, copies). Per step, ms.
"""
import collections
import gzip
import json
import sys


def load(name):
    return json.load(gzip.open(name + ".json.gz"))["traceEvents"]


def analyse(name):
    ev = load(name)
    windows = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("name") == "compute" and "dur" in e)
    k7 = sorted((e["ts"], e["ts"] + e["dur"], e["args"].get("correlation")) for e in ev if e.get("cat") == "kernel" and e["args"].get("stream") == 7)
    rt = {e["args"].get("correlation"): e for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
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
                if r is not None and r["ts"] + r["dur"] > prev_end:   # launch returned after the stream went idle: host late
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


if __name__ == "__main__":
    for n in sys.argv[1:]:
        analyse(n)
