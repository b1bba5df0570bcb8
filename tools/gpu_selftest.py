"""GPU decode self-test: run on the H200 (no network; DALI + torch installed). Exit status 0 = all checks pass.

    python tools/gpu_selftest.py JPEG_FOLDER [--num 512] [--batch 256] [--size 224] [--device 0]
    python tools/gpu_selftest.py JPEG_FOLDER --cpu      # same checks on DALI's CPU backend (smoke test anywhere)

Checks (reads files directly, no packer/ring): eval output vs torchvision reference (< 2/255 mean abs per image),
every colour mode incl. progressive JPEG, PNG, CMYK decoding to RGB, dtypes and channels_last, zero_copy on/off
equality, stream safety (a result read after later batches were decoded is unchanged); then img/s (train RRC) for
a few hw_decoder_load / thread settings, copy vs zero_copy. Prints one table.
"""
from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    import torch
    from PIL import Image

    from fastfeed import IMAGENET_MEAN, IMAGENET_STD
    from fastfeed.decode import crop_windows
    from fastfeed.decode.dali import DaliDecoder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the shared test fixtures
    from decode_samples import colour_variants, torchvision_eval_reference

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--num", type=int, default=512)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--cpu", action="store_true", help="DALI CPU backend (device_id=None)")
    a = ap.parse_args(argv)
    dev_id = None if a.cpu else a.device
    S = a.size
    rows: list[tuple[str, str, str]] = []  # (check, result, detail)
    failed = False

    def check(name, ok, detail=""):
        nonlocal failed
        failed |= not ok
        rows.append((name, "PASS" if ok else "FAIL", detail))

    paths = sorted(p for p in a.folder.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg"))[: a.num]
    if not paths:
        print(f"no JPEGs under {a.folder}", file=sys.stderr)
        return 2
    data = [p.read_bytes() for p in paths]
    arrs = [np.frombuffer(d, np.uint8) for d in data]
    sizes = [Image.open(io.BytesIO(d)).size for d in data]
    W = np.array([s[0] for s in sizes])
    H = np.array([s[1] for s in sizes])
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    bs = min(a.batch, len(arrs))

    def mk(**kw):
        kw.setdefault("batch_size", bs)
        return DaliDecoder(device_id=dev_id, image_size=S, **kw)

    # 1. eval vs torchvision
    n_eval = min(64, bs)
    d32 = mk(dtype=torch.float32, num_threads=4, batch_size=max(bs, 16))
    w = crop_windows(W[:n_eval], H[:n_eval], np.arange(n_eval), seed=0, epoch=0, train=False, image_size=S)
    out = d32(arrs[:n_eval], w).images.float().cpu()
    diffs = [float(((out[i] - torchvision_eval_reference(data[i], S, IMAGENET_MEAN, IMAGENET_STD)).abs() * std)
                   .mean()) * 255 for i in range(n_eval)]
    check("eval vs torchvision (<2/255)", max(diffs) < 2, f"max {max(diffs):.3f}/255, mean {np.mean(diffs):.3f}")

    # 2. colour modes (progressive, PNG, CMYK, gray, palette, RGBA, 16-bit) -> RGB, close to the baseline JPEG
    rgb = np.asarray(Image.open(io.BytesIO(data[0])).convert("RGB"))
    var = colour_variants(rgb)
    names = list(var)
    vw = crop_windows([rgb.shape[1]] * len(names), [rgb.shape[0]] * len(names), np.arange(len(names)), seed=0,
                      epoch=0, train=False, image_size=S)
    res = d32([np.frombuffer(var[n], np.uint8) for n in names], vw)
    pix = res.images.float().cpu() * std
    ref_c, ref_g = pix[names.index("jpeg_baseline")], pix[names.index("png_gray")]
    for i, n in enumerate(names):
        diff = float((pix[i] - (ref_g if "gray" in n else ref_c)).abs().mean()) * 255
        tol = 6 if n in ("png_palette", "jpeg_cmyk") else 3
        check(f"decode {n}", not res.replaced and diff < tol, f"{diff:.2f}/255 vs reference")

    # 3. dtypes, channels_last, zero_copy
    nb = min(16, bs)
    wt = crop_windows(W[:nb], H[:nb], np.arange(nb), seed=1, epoch=0, train=True, image_size=S)
    ref = d32(arrs[:nb], wt).images.float()
    for dt in (torch.float16, torch.bfloat16, torch.uint8):
        for cl in (False, True):
            for zc in ((False, True) if dev_id is not None else (False,)):
                o = mk(dtype=dt, channels_last=cl, zero_copy=zc)(arrs[:nb], wt).images
                fmt = torch.channels_last if cl else torch.contiguous_format
                # With hw_decoder_load < 1 DALI balances images between the hardware and the CUDA JPEG decoders
                # run by run, and the two differ by a few levels (measured: max 3/255 on an H200), so two decodes
                # of one batch agree on average, not pixel for pixel.
                if dt == torch.uint8:
                    expect = ((ref * std.to(ref.device) + torch.tensor(IMAGENET_MEAN, device=ref.device)
                               .view(3, 1, 1)) * 255).round()
                    diff = (o.float() - expect).abs()
                    err, mean_err = float(diff.max()), float(diff.mean())
                    ok = err <= 4.0 and mean_err <= 0.5
                else:
                    diff = (o.float() - ref).abs() * std.to(ref.device) * 255
                    err, mean_err = float(diff.max()), float(diff.mean())
                    ok = err <= 4.5 and mean_err <= 0.5
                ok &= o.dtype == dt and o.is_contiguous(memory_format=fmt) and tuple(o.shape) == (nb, 3, S, S)
                check(f"{str(dt)[6:]} cl={int(cl)} zc={int(zc)}", ok, f"max {err:.2f}/255, mean {mean_err:.3f}/255")

    # 4. stream safety: keep batch 0's result, decode more batches, compare with a host copy taken at once
    for zc in ((False, True) if dev_id is not None else (False,)):
        d = mk(dtype=torch.float16, zero_copy=zc)
        first = d(arrs[:bs], crop_windows(W[:bs], H[:bs], np.arange(bs), seed=2, epoch=0, train=True,
                                          image_size=S)).images
        snap = first.cpu().clone()
        for k in range(3):
            d(arrs[:bs][::-1], crop_windows(W[:bs][::-1], H[:bs][::-1], np.arange(bs) + 1000 * (k + 1), seed=2,
                                            epoch=0, train=True, image_size=S))
        check(f"stream safety zc={int(zc)}", torch.equal(first.cpu(), snap), "result unchanged after 3 batches")

    # 5. throughput
    perf = []
    loads = (0.65, 0.75, 0.9, 1.0) if dev_id is not None else (0.0,)
    for load in loads:
        for threads in (4, 8):
            for zc in ((False, True) if dev_id is not None else (False,)):
                d = mk(dtype=torch.float16, num_threads=threads, hw_decoder_load=load, zero_copy=zc)
                batches = [np.arange(i, min(i + bs, len(arrs))) for i in range(0, len(arrs), bs)]
                wins = [crop_windows(W[b], H[b], b, seed=0, epoch=0, train=True, image_size=S) for b in batches]
                d([arrs[i] for i in batches[0]], wins[0])
                if dev_id is not None:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                reps = 3
                for _ in range(reps):
                    for b, wb in zip(batches, wins):
                        d([arrs[i] for i in b], wb)
                if dev_id is not None:
                    torch.cuda.synchronize()
                perf.append((load, threads, zc, reps * len(arrs) / (time.perf_counter() - t0)))
                d.close()

    print(f"\nfastfeed GPU decode self-test ({'DALI CPU backend' if dev_id is None else f'cuda:{dev_id}'}, "
          f"{len(arrs)} JPEGs from {a.folder}, S={S}, batch {bs})")
    print(f"{'check':<34}{'result':<8}detail")
    for name, r, detail in rows:
        print(f"{name:<34}{r:<8}{detail}")
    print(f"\n{'hw_decoder_load':<17}{'threads':<9}{'zero_copy':<11}{'img/s':>8}")
    for load, threads, zc, ips in perf:
        print(f"{load:<17}{threads:<9}{int(zc):<11}{ips:>8.0f}")
    print("\nRESULT:", "FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
