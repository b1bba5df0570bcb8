"""Issue 14, nineteenth session: what makes a DALI CPU-backend pipeline take ~1 s to build on a host that sees a GPU
(5 ms with CUDA_VISIBLE_DEVICES=, 35-41 ms while a GPU pipeline is alive; eighteenth session, dali_probe.py).

    python3 benchmarks/h200/codec_probe.py --json $OUT/codec-probe.json

Each variant runs in a fresh child process that first initialises CUDA through torch (as a training script has),
then builds a DaliDecoder on DALI's CPU backend ROUNDS times (each closed before the next), then a GPU one twice,
then the CPU one again after the GPU ones were closed. The child also lists the shared objects that its first CPU
build mapped.
Variants (all but `default` set NVIMGCODEC_EXTENSIONS_PATH, which fastfeed then leaves alone):
  default        as a Loader builds it (since codecs.py: a CPU pipeline with the CPU extensions only)
  every          the folder of every extension: what DALI loads by itself (the default before codecs.py)
  cpu-ext        a folder holding only nvImageCodec's CPU extensions (libjpeg-turbo, OpenCV, libtiff, BMP, PNM): the
                 hypothesis was that the nvJPEG / nvJPEG2000 / nvTIFF extensions set up GPU state whenever an
                 nvImageCodec instance is created, which DALI's decoder operator does per pipeline
  no-nvjpeg, no-nvjpeg2k, no-nvtiff   all extensions but one (which one costs the time)
  gpu-trim       all but nvJPEG2000 and nvTIFF (what a GPU pipeline of packed JPEGs and PNGs needs)
  keep-nvjpeg    an nvJPEG hardware-backend handle created first and kept for the process (does a live handle make
                 later builds cheap, as a live GPU pipeline does?)
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fastfeed.decode.codecs import GPU_EXTENSIONS, extensions_folder  # noqa: E402

VARIANTS = ("default", "every", "cpu-ext", "no-nvjpeg", "no-nvjpeg2k", "no-nvtiff", "gpu-trim", "keep-nvjpeg")


def restricted(drop: tuple[str, ...], into: Path) -> Path:
    """A folder of links to the installed extensions but those whose names start with one of `drop`."""
    into.mkdir(parents=True, exist_ok=True)
    for f in extensions_folder().iterdir():
        if not f.name.startswith(drop):
            (into / f.name).symlink_to(f)
    return into


def mapped() -> set[str]:
    return {ln.split()[-1] for ln in Path("/proc/self/maps").read_text().splitlines() if ".so" in ln}


def child(rounds: int, keep: bool) -> dict:
    import torch

    from fastfeed.decode.dali import DaliDecoder

    if torch.cuda.is_available():  # the dev box has none: a smoke test of the CPU rows
        torch.ones(1, device="cuda").sum().item()
    res = {}
    if keep:
        import nvidia.dali
        lib = next(Path(nvidia.dali.__file__).resolve().parents[1].glob("cu*/lib/libnvjpeg.so*"))
        nvj = ctypes.CDLL(str(lib))
        handle = ctypes.c_void_p()
        t0 = time.perf_counter()
        rc = nvj.nvjpegCreateEx(3, None, None, 0, ctypes.byref(handle))  # 3 = NVJPEG_BACKEND_HARDWARE
        res["keep_handle_ms"] = (time.perf_counter() - t0) * 1e3
        res["keep_handle_rc"] = rc

    def build(device_id):
        t0 = time.perf_counter()
        d = DaliDecoder(device_id=device_id, image_size=64, batch_size=256, num_threads=2)
        return d, (time.perf_counter() - t0) * 1e3

    before = mapped()
    cpu = []
    for i in range(rounds):
        d, ms = build(None)
        cpu.append(ms)
        if i == 0:
            res["mapped_by_first_cpu_build"] = sorted(Path(p).name for p in mapped() - before)
        d.close()
    res["cpu_ms"] = cpu
    try:
        res["gpu_ms"] = []
        for _ in range(2):
            d, ms = build(0)
            res["gpu_ms"].append(ms)
            d.close()
    except Exception as e:  # the cpu-ext variant has no GPU decoder to build
        res["gpu_error"] = str(e)[:200]
    d, ms = build(None)
    res["cpu_after_gpu_closed_ms"] = ms
    d.close()
    return res


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.rounds, args.child == "keep-nvjpeg")), flush=True)
        return 0
    out = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "extensions": sorted(f.name for f in extensions_folder().iterdir())}
    tmp = Path(tempfile.mkdtemp(prefix="codec-probe-"))
    drops = {"every": (), "cpu-ext": GPU_EXTENSIONS, "no-nvjpeg": ("libnvjpeg_ext",),
             "no-nvjpeg2k": ("libnvjpeg2k_ext",), "no-nvtiff": ("libnvtiff_ext",),
             "gpu-trim": ("libnvjpeg2k_ext", "libnvtiff_ext")}
    for v in args.variants.split(","):
        env = dict(os.environ)
        if v in drops:
            env["NVIMGCODEC_EXTENSIONS_PATH"] = str(restricted(drops[v], tmp / v))
        run = subprocess.run([sys.executable, __file__, "--child", v, "--rounds", str(args.rounds)], env=env,
                             capture_output=True, text=True, timeout=240)
        line = next((x[7:] for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
        out[v] = json.loads(line) if line else {"returncode": run.returncode, "stderr": run.stderr[-1500:]}
        r = out[v]
        gpu = [round(x) for x in r["gpu_ms"]] if r.get("gpu_ms") else r.get("gpu_error")
        print(f"[{v}] cpu {[round(x) for x in r.get('cpu_ms', [])]} ms, gpu {gpu}, "
              f"cpu after gpu closed {round(r.get('cpu_after_gpu_closed_ms', -1))} ms, "
              f"keep handle {r.get('keep_handle_ms')}, rc {r.get('keep_handle_rc')}; "
              f"{'' if line else 'FAILED ' + r['stderr'][-400:]}", flush=True)
        if v in ("default", "every") and line:
            exts = [m for m in r["mapped_by_first_cpu_build"] if "_ext" in m]
            print(f"[{v}] extensions mapped by the first CPU build: {exts}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
