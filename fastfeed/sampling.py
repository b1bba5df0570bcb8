"""Which sample ids each rank reads in an epoch, in which order; exact and elastic mid-epoch resume. Pure numpy.

An epoch is planned in three steps, each a pure function:

1. **Epoch order** - a permutation of the N sample ids, from `ORDERS[order](n, rng, ...)` with
   `rng = default_rng(SeedSequence([seed, epoch]))`: never the clock, the pid or thread timing. `shuffle=False`
   gives 0..N-1.
2. **Rank shares** - the order is cut into `world_size` equal contiguous shares, `m` samples each; rank r reads
   positions `[r*m, (r+1)*m)`. Batches are consecutive runs of `batch_size` within a share, so every rank has the
   same number of batches and DDP never waits at the end of an epoch:

   - `drop_last=False`: `m = ceil(N / W)`. The `W*m - N` missing positions wrap around to the start of the order
     (as torch's DistributedSampler pads), so a few samples are read twice; the last batch may be short, and is
     equally short on every rank. The padding ends the last ranks' last batches (where it outnumbers a short last
     batch, the ranks before hold one real sample fewer each), so that the last step gathered over the ranks is
     its real samples, then all the padding: what Accelerate's `gather_for_metrics` trims.
   - `drop_last=True`: `m = floor(N / (W*B)) * B`. Every batch is full; the `N - W*m` samples at the end of the
     order are skipped this epoch (a different set each epoch, since the order changes).

   Worked examples (N samples, W ranks, batch size B; "batches" is per rank, the same on every rank):

   ====  ===  ===  =========  ==========  =======  ==========  ======  =======
   N     W    B    drop_last  per rank m  batches  last batch  padded  dropped
   ====  ===  ===  =========  ==========  =======  ==========  ======  =======
   10    2    4    False      5           2        1           0       0
   11    2    4    False      6           2        2           1       0
   11    2    4    True       4           1        4           0       3
   3     4    2    False      1           1        1           1       0
   3     4    2    True       -           -        -           -       error: no full batch
   16    4    4    True       4           1        4           0       0
   ====  ===  ===  =========  ==========  =======  ==========  ======  =======

3. **Resume** - `EpochPlan.state(k)` after k batches is a small JSON dict (a few ints and a list of
   `{world_size, batch_size, batches_done}` segments, never the permutation). `plan_epoch(..., resume=state)`
   recomputes the epoch order and replays the segments: the *remainder* after a segment is every sample not yet
   read (rank 0's unread tail, then rank 1's, ...), with unread padding kept apart and dropped samples left out.
   The new plan cuts the remainder with the rules of step 2 for the current world, padding first from the unread
   padding: at the same world size and batch size that is exactly the uninterrupted tail, batch for batch; at a
   new world size W' each remaining sample is read exactly once across the W' ranks (plus padding when
   `drop_last=False`; with `drop_last=True` up to W'*B-1 of them are skipped, as at any epoch end). Segments
   chain: W -> W' -> W''. The epochs after a resumed one are ordinary epochs at the current world size.

The orders (`ORDERS`, name -> function; trade-offs in each function's docstring): "global" and "shard".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from fastfeed.world import World

__all__ = ["EpochPlan", "plan_epoch", "epoch_order", "ORDERS", "STATE_VERSION"]

STATE_VERSION = 1
DEFAULT_SHARD_BUFFER = 4
_WINDOW_LOOP_MAX = 50_000


def global_order(n: int, rng: np.random.Generator, shard_of: np.ndarray | None, shard_buffer: int) -> np.ndarray:
    """A uniform random permutation of all N samples: the best shuffle, and random reads across the whole dataset.

    Right for local NVMe or data that fits the page cache; 10M samples take ~0.1 s.
    """
    del shard_of, shard_buffer
    return rng.permutation(n).astype(np.int64, copy=False)


def shard_order(n: int, rng: np.random.Generator, shard_of: np.ndarray | None, shard_buffer: int) -> np.ndarray:
    """Shard-local shuffle for cold or remote storage: shuffle the shard order, then shuffle the samples of each
    run of `shard_buffer` (K) consecutive shards together.

    Reading the result touches at most K shards at a time per rank (each rank's share is a contiguous run of the
    order), so reads stay near-sequential and a shard is fetched once, by one rank.

    Trade-off against "global": samples from shards that land in different windows are never adjacent, so a batch
    draws from at most K (or K+1 at a window edge) shards instead of from the whole dataset. If shards were packed
    with a class-mixing shuffle (`fastfeed pack --shuffle-seed`) each shard is already a random sample, and batches
    are nearly as diverse as under "global"; if shards hold one class each, a batch holds at most ~K classes and
    gradients are biased within an epoch - raise K (memory/readahead cost grows with it) or repack shuffled. The
    set of samples per epoch is the same as under "global"; only the correlation between neighbours differs.
    """
    shard_of = _check_shard_of(n, shard_of)
    # Each shard's samples as one contiguous run of `by_shard` (a packed dataset is already stored shard by shard).
    by_shard = np.arange(n, dtype=np.int64) if _nondecreasing(shard_of) else np.argsort(shard_of, kind="stable")
    shards, counts = np.unique(shard_of, return_counts=True)  # shard ids need not be contiguous
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    perm = rng.permutation(len(shards))
    # Concatenate the shards' runs in the shuffled shard order, without a Python loop over shards.
    lengths = counts[perm]
    run_starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    order = by_shard[np.repeat(starts[perm] - run_starts, lengths) + np.arange(n, dtype=np.int64)]
    # Shuffle inside each window of K consecutive shards.
    bounds = np.concatenate((run_starts[::shard_buffer], [n]))
    if len(bounds) - 1 <= _WINDOW_LOOP_MAX:
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            order[lo:hi] = order[lo:hi][rng.permutation(hi - lo)]
    else:  # very many tiny shards: one sort by (window, random key) beats a long Python loop
        window = np.repeat(np.arange(len(bounds) - 1, dtype=np.int64), np.diff(bounds))
        key = (window << 32) | rng.integers(0, 1 << 32, size=n, dtype=np.int64)
        order = order[np.argsort(key)]
    return order


def _check_shard_of(n: int, shard_of: np.ndarray | None) -> np.ndarray:
    if shard_of is None:
        raise ValueError('order="shard" needs shard_of: the shard id of every sample (int array of length n)')
    shard_of = np.asarray(shard_of)
    if shard_of.shape != (n,) or not np.issubdtype(shard_of.dtype, np.integer):
        raise ValueError(f"shard_of must be an integer array of shape ({n},), got {shard_of.dtype} {shard_of.shape}")
    if n and shard_of.min() < 0:
        raise ValueError("shard_of holds negative shard ids")
    return shard_of


def _nondecreasing(a: np.ndarray) -> bool:
    return bool(len(a) < 2 or (a[1:] >= a[:-1]).all())


ORDERS: dict[str, Callable[..., np.ndarray]] = {"global": global_order, "shard": shard_order}


def epoch_order(
    n: int, *, seed: int, epoch: int, shuffle: bool = True, order: str = "global",
    shard_of: np.ndarray | None = None, shard_buffer: int = DEFAULT_SHARD_BUFFER,
) -> np.ndarray:
    """The whole epoch's sample order (int64[n]), before it is cut into rank shares."""
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; choose one of {sorted(ORDERS)}")
    if isinstance(shard_buffer, bool) or not isinstance(shard_buffer, int) or shard_buffer < 1:
        raise ValueError(f"shard_buffer must be a positive integer, got {shard_buffer!r}")
    if not shuffle:
        if order == "shard":
            _check_shard_of(n, shard_of)  # fail on a bad call now, not only once shuffling is switched on
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(np.random.SeedSequence([seed, epoch]))
    return ORDERS[order](n, rng, shard_of, shard_buffer)


# ---- cutting an order into rank shares ----------------------------------------------------------------------
def _cut(real: np.ndarray, spare: np.ndarray, world_size: int, batch_size: int, drop_last: bool):
    """Lay `real` out as `world_size` equal shares of m samples: returns (m, sequence, is_padding).

    Padding takes `spare` first (the unread padding of a resumed run, so that resuming at the same world size
    reproduces it exactly), then wraps around to the start of `real`. The padding (fewer than `world_size`
    positions) ends the last ranks' last batches: the last rank's last batch, filled from its end, then the rank
    before's, so that every rank's last batch, concatenated in rank order (the last step gathered over the ranks),
    is its real samples followed by all the padding. Where the padding fits the last rank's last batch, that is the
    padding at the end of the order; where it does not (a last batch shorter than the padding), the ranks before
    hold one real sample fewer each for it, instead of the last rank's earlier batches holding padding.
    """
    if drop_last:
        m = (len(real) // (world_size * batch_size)) * batch_size
        return m, real[: world_size * m], np.zeros(world_size * m, dtype=bool)
    m = -(-len(real) // world_size)
    short = world_size * m - len(real)
    source = np.concatenate((spare, real))
    pad = np.resize(source, short) if short else source[:0]
    last = m - (-(-m // batch_size) - 1) * batch_size if m else 0
    pads = np.zeros(world_size, dtype=np.int64)  # padding positions at the end of each rank's share
    for r in range(world_size - 1, -1, -1):
        pads[r] = min(last, short - int(pads.sum()))
    ends = np.cumsum(m - pads)
    seq = np.empty(world_size * m, dtype=np.int64)
    is_pad = np.zeros(world_size * m, dtype=bool)
    used = 0
    for r in range(world_size):
        mine = real[ends[r] - (m - pads[r]) : ends[r]]
        seq[r * m : r * m + len(mine)] = mine
        seq[r * m + len(mine) : (r + 1) * m] = pad[used : used + pads[r]]
        is_pad[r * m + len(mine) : (r + 1) * m] = True
        used += int(pads[r])
    return m, seq, is_pad


def _remainder(real: np.ndarray, spare: np.ndarray, segment: dict, drop_last: bool):
    """After `batches_done` batches at (world_size, batch_size): the unread real samples (every rank's unread tail,
    in rank order) and the unread padding, kept apart so padding is never promoted to a real sample."""
    w, b, k = segment["world_size"], segment["batch_size"], segment["batches_done"]
    m, seq, is_pad = _cut(real, spare, w, b, drop_last)
    if k > -(-m // b):
        raise ValueError(f"resume segment {segment} claims more batches than that run had ({-(-m // b)})")
    if m == 0:
        return real[:0], spare[:0]
    unread = np.arange(len(seq), dtype=np.int64) % m >= k * b
    return seq[unread & ~is_pad], seq[unread & is_pad]


@dataclass(frozen=True, eq=False)  # eq would compare numpy arrays elementwise
class EpochPlan:
    """One rank's reading plan for one epoch (or for the remainder of a resumed epoch).

    Attributes:
        indices: int64 sample ids this rank reads, in consumption order (padding included).
        padded: bool mask over `indices`, True for wrap-around padding (a sample read twice this epoch); an
            evaluation loop can use it to skip the duplicates.
        num_batches: batches on every rank; `batch(i)` is `indices[i*B : (i+1)*B]`, the last one may be short.
        batch_size, world, epoch: what the plan was made for.
        total_padding: padded positions over all ranks (fewer than world_size, all of them at the end of the last
            ranks' last batches: `_cut`), so the last step's real samples are `world_size * last_batch_size -
            total_padding`, and they come first when that step is gathered in rank order.
        first_batch: batches of this epoch already read before this plan (a resumed plan's offset; 0 otherwise),
            so `first_batch + i` names batch i of the plan within the epoch.
    """

    indices: np.ndarray
    padded: np.ndarray
    num_batches: int
    batch_size: int
    world: World
    epoch: int
    total_padding: int
    first_batch: int
    _header: dict = field(repr=False)
    _segments: tuple = field(repr=False)

    def batch(self, i: int) -> np.ndarray:
        if not 0 <= i < self.num_batches:
            raise IndexError(f"batch {i} out of range: this plan has {self.num_batches} batches")
        return self.indices[i * self.batch_size : (i + 1) * self.batch_size]

    @property
    def last_batch_size(self) -> int:
        return len(self.indices) - (self.num_batches - 1) * self.batch_size if self.num_batches else 0

    def state(self, batches_done: int) -> dict:
        """JSON-serialisable position after `batches_done` batches of this plan (the same on every rank)."""
        if isinstance(batches_done, bool) or not isinstance(batches_done, int):
            raise ValueError(f"batches_done must be an integer, got {batches_done!r}")
        if not 0 <= batches_done <= self.num_batches:
            raise ValueError(f"batches_done must be in [0, {self.num_batches}], got {batches_done}")
        segment = {"world_size": self.world.world_size, "batch_size": self.batch_size, "batches_done": batches_done}
        return {**self._header, "segments": [dict(s) for s in self._segments] + [segment]}


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_state(state: object, header: dict) -> list[dict]:
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"not a fastfeed sampling state (version {STATE_VERSION}): {state!r:.200}")
    for key, value in header.items():
        if state.get(key) != value:
            raise ValueError(f"resume state has {key}={state.get(key)!r} but this run has {key}={value!r}; "
                             "a state only resumes the same dataset, seed, epoch and ordering")
    segments = state.get("segments")
    if not isinstance(segments, list) or not segments:
        raise ValueError("resume state has no segments")
    clean = []
    for s in segments:
        if not isinstance(s, dict) or set(s) != {"world_size", "batch_size", "batches_done"}:
            raise ValueError(f"malformed resume segment {s!r}")
        clean.append({k: _check_int(f"segment {k}", s[k], 1 if k != "batches_done" else 0) for k in s})
    return clean


def plan_epoch(
    n: int,
    *,
    seed: int,
    epoch: int,
    world: World,
    batch_size: int,
    drop_last: bool = False,
    shuffle: bool = True,
    order: str = "global",
    shard_of: np.ndarray | None = None,
    shard_buffer: int = DEFAULT_SHARD_BUFFER,
    resume: dict | None = None,
) -> EpochPlan:
    """Plan `world.rank`'s batches of `epoch` over a dataset of `n` samples (see the module docstring).

    `resume`: a state from `EpochPlan.state(k)` of this epoch, saved at any world size; the plan then covers
    exactly what that run had not read yet.
    """
    n = _check_int("dataset length", n, 1)
    seed = _check_int("seed", seed, 0)
    epoch = _check_int("epoch", epoch, 0)
    batch_size = _check_int("batch_size", batch_size, 1)
    if not isinstance(world, World):
        raise ValueError(f"world must be a fastfeed.world.World, got {world!r}")
    header = {"version": STATE_VERSION, "n": n, "seed": seed, "epoch": epoch, "shuffle": bool(shuffle),
              "drop_last": bool(drop_last), "order": order,
              "shard_buffer": shard_buffer if order == "shard" else None}
    base = epoch_order(n, seed=seed, epoch=epoch, shuffle=shuffle, order=order, shard_of=shard_of,
                       shard_buffer=shard_buffer)
    segments: list[dict] = []
    spare = base[:0]
    if resume is not None:
        segments = _check_state(resume, header)
        for s in segments:
            base, spare = _remainder(base, spare, s, drop_last)
    elif drop_last and n < world.world_size * batch_size:
        raise ValueError(f"drop_last=True with {n} samples, world size {world.world_size} and batch size "
                         f"{batch_size}: not one full batch per rank; use drop_last=False or a smaller batch")

    m, seq, is_pad = _cut(base, spare, world.world_size, batch_size, drop_last)
    share = slice(world.rank * m, (world.rank + 1) * m)
    return EpochPlan(
        indices=seq[share], padded=is_pad[share], num_batches=math.ceil(m / batch_size), batch_size=batch_size,
        world=world, epoch=epoch, total_padding=int(is_pad.sum()),
        first_batch=sum(s["batches_done"] for s in segments), _header=header, _segments=tuple(segments),
    )
