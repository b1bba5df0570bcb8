"""numpy's default generator for many samples at once, compiled: `first_draws(entropy, n)` is, row for row,
`np.random.default_rng(np.random.SeedSequence(list(row))).random(n)`, to the bit; `seed_stream`, `next_double` and
`below` (`integers(0, n)`) draw the same values as that Generator in numba code.

Why: each training batch draws its geometry from one generator per sample (geometry.sample_rng); building 64 of them
in Python (a SeedSequence, a PCG64, a Generator) held the GIL for about a millisecond a batch. This is numpy's own
arithmetic (numpy/random/bit_generator.pyx: SeedSequence's hash mixing and `generate_state`; pcg64.h: PCG64's
seeding, its 128-bit step and XSL-RR output; `next_double`), in 32- and 64-bit halves, for non-negative entropy
words under 2**64. tests/test_detect_geometry.py holds it to numpy's values.
"""
from __future__ import annotations

import numpy as np

from fastfeed.decode.numba_import import import_numba

numba = import_numba()

__all__ = ["first_draws", "entropy_rows", "seed_stream", "next64", "next_double", "below", "STATE_WORDS"]

_M32 = np.uint64(0xFFFFFFFF)
_U32 = np.uint64(32)
_XSHIFT = np.uint64(16)
_INIT_A, _MULT_A = np.uint64(0x43B0D7E5), np.uint64(0x931E8875)
_INIT_B, _MULT_B = np.uint64(0x8B51F9DD), np.uint64(0x58F38DED)
_MIX_L, _MIX_R = np.uint64(0xCA01F9DD), np.uint64(0x4973F715)
_PCG_HI, _PCG_LO = np.uint64(2549297995355413924), np.uint64(4865540595714422341)
_POOL = 4


@numba.njit(cache=True, inline="always")
def _hashmix(value, h):
    """SeedSequence's hashmix on uint32 values held in uint64: (mixed value, the next hash constant)."""
    value = value ^ h
    h = (h * _MULT_A) & _M32
    value = (value * h) & _M32
    return value ^ (value >> _XSHIFT), h


@numba.njit(cache=True, inline="always")
def _mix(x, y):
    r = (_MIX_L * x - _MIX_R * y) & _M32
    return r ^ (r >> _XSHIFT)


@numba.njit(cache=True, inline="always")
def _mulhi(a, b):
    """The high 64 bits of the 128-bit product of two uint64."""
    a_lo, a_hi, b_lo, b_hi = a & _M32, a >> _U32, b & _M32, b >> _U32
    lo_lo = a_lo * b_lo
    mid1 = a_hi * b_lo + (lo_lo >> _U32)
    mid2 = a_lo * b_hi + (mid1 & _M32)
    return a_hi * b_hi + (mid1 >> _U32) + (mid2 >> _U32)


@numba.njit(cache=True, inline="always")
def _step(hi, lo, inc_hi, inc_lo):
    """PCG64's state <- state * multiplier + inc, mod 2**128, as (high, low) halves."""
    new_lo = lo * _PCG_LO
    new_hi = _mulhi(lo, _PCG_LO) + lo * _PCG_HI + hi * _PCG_LO
    out_lo = new_lo + inc_lo
    carry = np.uint64(1) if out_lo < new_lo else np.uint64(0)
    return new_hi + inc_hi + carry, out_lo


# A stream's state: uint64 [6] = PCG64's 128-bit state (high, low), its increment (high, low), and numpy's buffered
# upper half of a 64-bit draw (whether there is one, its value), which its 32-bit draws use.
STATE_WORDS = 6


@numba.njit(cache=True)
def seed_stream(entropy_row, state):
    """state <- the stream of `np.random.default_rng(np.random.SeedSequence(list(entropy_row)))`."""
    words = np.empty(2 * entropy_row.shape[0], np.uint64)
    pool = np.empty(_POOL, np.uint64)
    # numpy's _coerce_to_uint32_array: each integer as its 32-bit words, least significant first (0: one word)
    m = 0
    for j in range(entropy_row.shape[0]):
        v = entropy_row[j]
        words[m] = v & _M32
        m += 1
        if v >> _U32:
            words[m] = v >> _U32
            m += 1
    # SeedSequence.mix_entropy
    h = _INIT_A
    for i in range(_POOL):
        pool[i], h = _hashmix(words[i] if i < m else np.uint64(0), h)
    for i_src in range(_POOL):
        for i_dst in range(_POOL):
            if i_src != i_dst:
                mixed, h = _hashmix(pool[i_src], h)
                pool[i_dst] = _mix(pool[i_dst], mixed)
    for i_src in range(_POOL, m):
        for i_dst in range(_POOL):
            mixed, h = _hashmix(words[i_src], h)
            pool[i_dst] = _mix(pool[i_dst], mixed)
    # SeedSequence.generate_state(4, uint64): 8 words of 32 bits, paired little-endian
    gen = np.empty(8, np.uint64)
    h = _INIT_B
    for i in range(8):
        d = pool[i % _POOL] ^ h
        h = (h * _MULT_B) & _M32
        d = (d * h) & _M32
        gen[i] = d ^ (d >> _XSHIFT)
    seed_hi, seed_lo = gen[0] | (gen[1] << _U32), gen[2] | (gen[3] << _U32)
    inc_hi, inc_lo = gen[4] | (gen[5] << _U32), gen[6] | (gen[7] << _U32)
    # pcg64_set_seed: inc = (seq << 1) | 1; state = 0; step; state += seed; step
    inc_hi = (inc_hi << np.uint64(1)) | (inc_lo >> np.uint64(63))
    inc_lo = (inc_lo << np.uint64(1)) | np.uint64(1)
    hi, lo = _step(np.uint64(0), np.uint64(0), inc_hi, inc_lo)
    lo2 = lo + seed_lo
    hi = hi + seed_hi + (np.uint64(1) if lo2 < lo else np.uint64(0))
    hi, lo = _step(hi, lo2, inc_hi, inc_lo)
    state[0], state[1], state[2], state[3] = hi, lo, inc_hi, inc_lo
    state[4], state[5] = np.uint64(0), np.uint64(0)


@numba.njit(cache=True, inline="always")
def next64(state):
    """PCG64's next 64-bit draw (step, then XSL-RR output)."""
    hi, lo = _step(state[0], state[1], state[2], state[3])
    state[0], state[1] = hi, lo
    x = hi ^ lo
    r = hi >> np.uint64(58)
    return x if r == 0 else (x >> r) | (x << (np.uint64(64) - r))


@numba.njit(cache=True, inline="always")
def next_double(state):
    """Generator.random()'s next value."""
    return np.float64(next64(state) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@numba.njit(cache=True, inline="always")
def _next32(state):
    if state[4]:
        state[4] = np.uint64(0)
        return state[5]
    x = next64(state)
    state[4], state[5] = np.uint64(1), x >> _U32
    return x & _M32


@numba.njit(cache=True)
def below(state, n):
    """Generator.integers(0, n)'s next value for 1 <= n < 2**32 (numpy's buffered Lemire method)."""
    rng = np.uint64(n - 1)
    if rng == 0:
        return 0
    excl = rng + np.uint64(1)
    m = _next32(state) * excl
    leftover = m & _M32
    if leftover < excl:
        threshold = (_M32 - rng) % excl
        while leftover < threshold:
            m = _next32(state) * excl
            leftover = m & _M32
    return np.int64(m >> _U32)


@numba.njit(cache=True, nogil=True)
def _first_draws(entropy, n):
    out = np.empty((entropy.shape[0], n), np.float64)
    state = np.empty(STATE_WORDS, np.uint64)
    for k in range(entropy.shape[0]):
        seed_stream(entropy[k], state)
        for j in range(n):
            out[k, j] = next_double(state)
    return out


def entropy_rows(entropy) -> np.ndarray:
    """Checked entropy: non-negative integers under 2**64, [rows, words], as uint64."""
    e = np.asarray(entropy)
    if e.ndim != 2 or (e.size and (not np.issubdtype(e.dtype, np.integer) or (e < 0).any())):
        raise ValueError(f"need non-negative integers [rows, words], got {e.dtype} {e.shape}")
    return np.ascontiguousarray(e, dtype=np.uint64)


def first_draws(entropy, n: int) -> np.ndarray:
    """float64 [rows, n]: row i is the first n `random()` draws of
    `np.random.default_rng(np.random.SeedSequence(list(entropy[i])))`. entropy: non-negative integers under 2**64,
    [rows, words]."""
    return _first_draws(entropy_rows(entropy), int(n))
