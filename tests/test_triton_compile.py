"""Every Triton kernel of the package compiled for the GPUs it runs on (Hopper and Ampere), here, without one.

Triton's interpreter (how the other tests run the kernels on the CPU) executes code its compiler refuses: a loop
over a tuple of tensors, a loop-carried value whose type changes. Each reached a GPU host before it failed there.
Compiling to a cubin needs no GPU or driver (the wheel brings ptxas), so the refusal shows here first. The
signatures are the kernels' launches (hsv.finish_nhwc, gpu_render.render_batch): a kernel whose arguments change
fails here until its line below changes with it.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration

triton = pytest.importorskip("triton")

TARGETS = [("cuda", 90, 32), ("cuda", 80, 32)]  # H100/H200, A100


def _compile(fn, signature: dict, constexprs: dict, target, **options):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = dict(signature, **{name: "constexpr" for name in constexprs})
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs), target=GPUTarget(*target),
                          options=options or None)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t[1]}")
@pytest.mark.parametrize("out", ["*fp16", "*bf16", "*fp32", "*u8"])
@pytest.mark.parametrize("hsv", [True, False], ids=["hsv", "no-hsv"])
def test_the_last_pass_compiles(target, out, hsv):
    from fastfeed.detect.hsv import _BLOCK, _kernel

    norm = out != "*u8"
    signature = {"px": "*u8", "out": out, "gains": "*fp32", "n": "i32", "sb": "i64", "sc": "i64", "sp": "i64",
                 **{name: "fp32" for name in ("m0", "m1", "m2", "d0", "d1", "d2")}}
    done = _compile(_kernel(), signature, {"HSV": hsv, "NORM": norm, "BLOCK": _BLOCK}, target)
    assert done.asm["cubin"]
    if norm:  # torch's normalisation to the bit: an IEEE division, not the approximate one Triton's `/` makes
        assert "div.rn.f32" in done.asm["ptx"]


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: f"sm{t[1]}")
def test_the_renderers_kernels_compile(target):
    from fastfeed.detect.gpu_render import _BLOCK, _NCOL, _kernels

    coeffs, horizontal, vertical = _kernels()
    tiles = {"table": "*i64", "n_tiles": "i32", "steps": "i32"}
    done = [_compile(horizontal, {"src": "*u8", "tmp": "*u8", **tiles, "h_start": "*i32", "h_w": "*i32", "KH": "i32"},
                     {"NCOL": _NCOL, "BLOCK": _BLOCK}, target),
            _compile(vertical, {"tmp": "*u8", "out": "*u8", **tiles, "v_start": "*i32", "v_w": "*i32", "KV": "i32",
                                "S": "i32"}, {"NCOL": _NCOL, "BLOCK": _BLOCK}, target)]
    for off, size, box in ((14, 1, 0), (13, 2, 1)):  # columns, rows
        done.append(_compile(coeffs, {"table": "*i64", "box": "*fp64", "n_tiles": "i32", "steps": "i32",
                                      "total": "i32", "K": "i32", "starts": "*i32", "weights": "*i32"},
                             {"OFF": off, "SIZE": size, "BOX": box, "NCOL": _NCOL, "BLOCK": _BLOCK}, target,
                             enable_fp_fusion=False))
    assert all(d.asm["cubin"] for d in done)
    # Pillow's float64 arithmetic to the bit: IEEE divisions, and no multiply-add fused into one rounding
    ptx = done[-1].asm["ptx"]
    assert "div.rn.f64" in ptx and "fma.rn.f64" not in ptx
