"""The odd-image corpus through the GPU decoder: the device half of issue 13's decode-contract check.

    python tools/odd_corpus_gpu.py [--device 0] [--size 64]     # on the H200
    python tools/odd_corpus_gpu.py --cpu                         # DALI's CPU backend instead (smoke test anywhere)

Builds the corpus (tests/odd_images/build.py: PIL + numpy only), packs it with fastfeed's packer, then decodes every
packed sample with the DALI GPU decoder (hw_decoder_load 1.0 and 0.0: hardware and CUDA JPEG decoders) and with
the CPU decoder (cpu-pil, draft off), under both orientation policies, eval windows and random train windows. Prints
per file the mean abs difference GPU vs CPU and GPU vs the reference (torchvision's eval transform on PIL's reading
of the original file, tests/odd_images/reference.py), then one line:
    PASS|FAIL odd corpus: <n> files, max mean abs diff <x>/255 (threshold 2/255)
A crash of the process (the bug this guards: EXIF 5-8 non-square JPEGs) is a FAIL too; the last part decodes with
windows computed on the unrotated size under policy "exif" on purpose. Needs fastfeed (+ torch), DALI, PIL, numpy.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
THRESHOLD = 2.0


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    import torch

    from fastfeed import open_dataset
    from fastfeed.decode import crop_windows, make_decoder, oriented_size
    from fastfeed.pack import PackOptions, pack
    from odd_images.build import build_corpus
    from odd_images.reference import reference_eval

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--cpu", action="store_true", help="DALI's CPU backend instead of the GPU")
    a = ap.parse_args(argv)
    S = a.size
    failed = False

    with tempfile.TemporaryDirectory() as tmp:
        cases = {c.name: c for c in build_corpus(os.path.join(tmp, "src"))}
        res = pack(os.path.join(tmp, "src"), os.path.join(tmp, "packed"), PackOptions(workers=2))
        rejected = {os.path.basename(r["path"]) for r in res.rejected}
        expect_rej = {n for n, c in cases.items() if c.expect == "reject"}
        if rejected != expect_rej:
            failed = True
            print(f"FAIL pack: rejected {sorted(rejected ^ expect_rej)} unexpectedly (or not)")
        with open_dataset(os.path.join(tmp, "packed")) as ds:
            names = [os.path.basename(str(s)) for s in ds.sources]
            stored = [bytes(ds.read(i)) for i in range(len(ds))]
            W, H = np.asarray(ds.widths), np.asarray(ds.heights)
            tags, pil = np.asarray(ds.orientations), np.asarray(ds.pil_only)  # the decoders hand `pil` to PIL
        originals = [Path(cases[n].path).read_bytes() for n in names]
    arrs = [np.frombuffer(s, np.uint8) for s in stored]
    n = len(arrs)
    print(f"{n} packed files ({len(rejected)} rejected by pack); device: "
          f"{'DALI CPU' if a.cpu else torch.cuda.get_device_name(a.device)}")

    def decode(kind, policy, win, **kw):
        dev = "cpu" if kind != "dali" else f"cuda:{a.device}"
        with make_decoder(kind, device=dev, device_id=a.device, image_size=S, dtype=torch.uint8, batch_size=n,
                          num_threads=4, orientation=policy, **kw) as d:
            r = d(arrs, win)
            if kind == "dali":
                torch.cuda.synchronize(a.device)
        return r.images.permute(0, 2, 3, 1).cpu().numpy().astype(np.int16), r.replaced

    gpu_kind = "cpu-dali" if a.cpu else "dali"
    loads = (0.9,) if a.cpu else (1.0, 0.0)
    worst = 0.0
    for policy in ("ignore", "exif"):
        w, h = oriented_size(W, H, tags, policy)
        for train in (False, True):
            win = crop_windows(w, h, np.arange(n), seed=7, epoch=0, train=train, image_size=S, pil=pil)
            cpu, cpu_rep = decode("cpu-pil", policy, win, draft=False)
            refs = [reference_eval(o if _pil_reads(o) else s, S, policy).astype(np.int16)
                    for o, s in zip(originals, stored)] if not train else None
            for load in loads:
                gpu, rep = decode(gpu_kind, policy, win, hw_decoder_load=load)
                if rep or cpu_rep:
                    failed = True
                    print(f"FAIL replaced samples: gpu {rep} cpu {cpu_rep}")
                print(f"\n[{policy}, {'train' if train else 'eval'}, hw_decoder_load={load}]  "
                      f"{'file':44s} gpu-cpu  gpu-ref  cpu-ref")
                for i in range(n):
                    d_gc = float(np.abs(gpu[i] - cpu[i]).mean())
                    d_gr = float(np.abs(gpu[i] - refs[i]).mean()) if refs else float("nan")
                    d_cr = float(np.abs(cpu[i] - refs[i]).mean()) if refs else float("nan")
                    m = max(d_gc, 0.0 if refs is None else max(d_gr, d_cr))
                    worst = max(worst, m)
                    flag = "  <-- over threshold" if m >= THRESHOLD else ""
                    print(f"  {names[i]:44s} {d_gc:7.2f}  {d_gr:7.2f}  {d_cr:7.2f}{flag}")
    # Stale windows (computed on the unrotated size) under "exif": must not crash, whatever the pixels.
    win = crop_windows(W, H, np.arange(n), seed=3, epoch=0, train=True, image_size=S, pil=pil)
    _, rep = decode(gpu_kind, "exif", win)
    print(f"\nstale-window exif run: no crash; {len(rep)} replaced")
    failed |= bool(rep) or worst >= THRESHOLD
    print(f"{'FAIL' if failed else 'PASS'} odd corpus: {n} files, max mean abs diff {worst:.2f}/255 "
          f"(threshold {THRESHOLD:.0f}/255)")
    return 1 if failed else 0


def _pil_reads(data: bytes) -> bool:
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
        return True
    except Exception:  # noqa: BLE001 - e.g. junk after SOI: the reference then reads the packed (fixed) bytes
        return False


if __name__ == "__main__":
    sys.exit(main())
