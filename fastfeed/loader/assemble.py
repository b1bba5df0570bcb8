"""What one batch of the ring becomes for the training loop: (images, labels) on the device.

`BatchAssembler.produce` holds back the samples no decoder may see (a read error, a checksum mismatch, an unchecked
JPEG or PNG that pack would not have stored), decodes the rest, and keeps the batch's shape: a position whose sample is
bad holds a copy of another sample of its batch, label included, and a batch whose every sample is bad is filled with a
good sample from the rest of the epoch. In evaluation a position that holds no sample of its own is labelled
IGNORE_INDEX, so every sample is scored once. With on_error="raise" it raises LoaderError naming the samples instead.
The decode workers of `epoch.EpochRun` share one assembler, which changes nothing per batch (the consumer's `report`
keeps the log of the samples already named); a Loader gives all its runs the same one, so a sample is named once.

A batch's replaced samples are counted in `stats()["skipped"]` (and logged) when the run hands the batch to the loop
(`report`), not when it is decoded: a Loader decodes the next epoch's first batches while the loop finishes
this one (NOTE [Reading on into the next epoch] in fastfeed/loader/loader.py), and counted at decode time a bad sample
in them would show in the stats of the epoch before, or not, as the decode won or lost the race with the loop's
`stats()` call. Counted at hand-out, the skips are those of the batches the loop got.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from fastfeed.constants import IGNORE_INDEX
from fastfeed.decode import crop_windows
from fastfeed.decode.base import DECODE_ERROR, CorruptSampleError, replacement_map
from fastfeed.detect.decoder import DetectRequest
from fastfeed.image import jpeg
from fastfeed.loader.fields import BAD_FIELD, MISSING_FIELD, SampleFields, collate
from fastfeed.loader.ring import RingReadError
from fastfeed.targets import Targets

__all__ = ["BatchAssembler", "LoaderError", "SampleTable", "SKIP_CODES"]

log = logging.getLogger("fastfeed")

_FILL_CANDIDATES = 64  # other samples of the epoch tried for a batch whose every sample is bad
_EMPTY = np.empty(0, dtype=np.uint8)

# Why a batch position holds a copy of another sample (stats()["skipped"] keys; the same on every decoder).
SKIP_CODES = ("read_error", "checksum", "not_image", "decode_error", MISSING_FIELD, BAD_FIELD)


# The detection batch's tensors a model reads (the rest stays on the host: _finish_detection).
_ON_DEVICE = ("images", "boxes", "labels", "batch_idx", "masks")


class LoaderError(RuntimeError):
    """An error raised in a decode worker, re-raised in the training loop with where it happened."""


@dataclass(frozen=True)
class SampleTable:
    """What the batches need to know about every sample, by sample id.

    labels: int64 [N] (CPU). widths/heights: the displayed size crop windows are computed on (the stored size
    under the orientation policy: `decode.oriented_size`). keys: each sample's source
    name (for messages and logs). read(i): one sample's bytes, for the per-sample fallback after a ring read error
    and for refilling a batch. bad_checksums(indices, samples, digests=None): the positions whose bytes do not
    match the sample table's checksum, or None when the dataset has none or checks are off; `digests` is the ring
    batch's native xxh3_64 of each sample (`RingBatch.digests`) when the ring computed them, so only the comparison
    runs with the GIL held, and None where the samples must be hashed here (the per-sample fallback reads).
    """

    labels: torch.Tensor
    widths: np.ndarray
    heights: np.ndarray
    keys: Sequence
    read: Callable[[int], bytes]
    bad_checksums: Callable[..., list] | None = None
    targets: Targets | None = None  # task "detect": every sample's objects (fastfeed.targets)
    fields: SampleFields | None = None  # Loader(fields=...): each read spans the image and these members
    # bool [N]: the samples only the decode contract's PIL decode reads as stored (samples.npz `pil_only`); the
    # decoders get them with each batch's windows or request and route them there
    pil_only: np.ndarray | None = None
    # uint8 [N]: the EXIF orientation each detection sample is displayed by (orientation "exif"), None otherwise
    orientations: np.ndarray | None = None
    # file_of(i): the data file holding sample i, for messages: adopted shards may reuse a key in another shard
    file_of: Callable[[int], str] | None = None


class BatchAssembler:
    """One batch at a time, for a run's decode workers (see the module docstring); `settings` are the Loader's,
    `table` its SampleTable, `stats` its StageStats (decode time, samples, batches and skips are counted there)."""

    def __init__(self, settings, table: SampleTable, stats):
        self.settings, self.table, self.stats = settings, table, stats
        self._logged: set[int] = set()  # sample ids already named in a warning (at most 1,000)

    def produce(self, plan, j: int, slot, decoder, stream):
        """Batch j of `plan` from its ring batch (or the RingReadError the ring raised for it), decoded by `decoder`
        on `stream` (None on the CPU): (images, labels, event, replaced), the event recorded on `stream` after the
        batch, `replaced` the [(code, sample id, detail)] of its positions holding another sample, for `report`."""
        s = self.settings
        if isinstance(slot, BaseException) and not isinstance(slot, RingReadError):
            raise slot
        bad: dict[int, tuple[str, str]] = {}  # position -> (code, detail), found before decoding
        rb = None
        digests = None  # the ring's xxh3 of each sample, when it computes them
        if isinstance(slot, RingReadError):
            if s.on_error == "raise":
                raise slot
            # The ring failed this batch; read it sample by sample so one bad extent costs one sample, not a batch.
            indices = np.asarray(plan.batch(j), dtype=np.int64)
            samples = []
            for p, i in enumerate(indices.tolist()):
                data, err = self._read_one(i)
                samples.append(data)
                if err:
                    bad[p] = ("read_error", err)
        else:
            rb = slot
            indices = np.asarray(rb.indices, dtype=np.int64)
            samples = rb.samples()
            digests = rb.digests
        values = None
        try:
            if self.table.fields is not None:  # each read spans the image and its members: cut them apart
                samples, values, field_bad = self.table.fields.split(indices, samples)
                for p, why in field_bad.items():
                    bad.setdefault(p, why)
            for p, why in self._untrusted(indices, samples, digests).items():
                bad.setdefault(p, why)
            if bad and s.on_error == "raise":
                raise LoaderError(f"sample(s) {self._names(indices, sorted(bad))} in batch {j} of epoch "
                                  f"{plan.epoch}: " + "; ".join(f"{c}: {d}" for c, d in bad.values()))
            for p in bad:
                samples[p] = _EMPTY  # the decoder reports it as not an image; its code stays the one found here
            with self.stats.timed("decode", n=len(indices)):
                if stream is not None:
                    with torch.cuda.stream(stream):
                        batch, replaced = self._decode(plan, j, decoder, indices, samples, bad, values)
                        event = torch.cuda.Event()
                        event.record(stream)
                else:
                    batch, replaced = self._decode(plan, j, decoder, indices, samples, bad, values)
                    event = None
        finally:
            del samples
            if rb is not None:
                rb.release()  # the decoder has returned: nothing reads the slot any more
        self.stats.add("samples", len(indices))
        self.stats.add("batches", 1)
        return batch, event, [(code, int(indices[p]), detail) for p, code, detail in replaced]

    def _decode(self, plan, k, decoder, indices, samples, bad, values=None):
        """Batch k of `plan` on the device — (images, labels) for classification, the detection dict for "detect",
        a dict with `fields` — and [(position, code, detail)] of positions holding another sample. `values`: the
        requested members' values by field, by position (SampleFields.split)."""
        s = self.settings
        try:
            result = decoder(samples, self._windows(plan, indices, values))
        except CorruptSampleError as exc:
            if s.on_error == "raise":
                raise LoaderError(f"corrupt sample(s) {self._names(indices, exc.positions)} in batch {k} of epoch "
                                  f"{plan.epoch}: {exc}") from exc
            if len(exc.positions) < len(indices):
                raise
            return self._fill_from_epoch(plan, k, decoder, indices, exc, bad)
        replaced = [(r.position, *bad[r.position]) if r.position in bad else tuple(r) for r in result.replaced]
        sources = replacement_map([p for p, _, _ in replaced], len(indices))
        if self.table.targets is not None:
            return self._with_fields(self._finish_detection(plan, k, result, sources), values, sources), replaced
        labels = self.table.labels[torch.from_numpy(indices)]
        for dst, src in sources.items():
            labels[dst] = labels[src]
        return self._classification(result.images, self._finish_labels(plan, k, labels, sources), values,
                                    sources), replaced

    def _classification(self, images, labels, values, sources: dict):
        """(images, labels), or with fields the dict of them and each field (`_with_fields`)."""
        if self.table.fields is None:
            return images, labels
        return self._with_fields({"images": images, "labels": labels}, values, sources)

    def _with_fields(self, batch: dict, values: dict | None, sources: dict) -> dict:
        """The batch dict with each requested field collated (a replaced position takes its source's values, as it
        takes its pixels and label); "cls" is the labels."""
        fields = self.table.fields
        if fields is None:
            return batch
        for name in fields.names:
            if name == self.settings.mask:  # read for the decoder, handed out as the batch's "masks"
                continue
            if fields.kinds[name] == "label":
                batch[name] = batch["labels"]
                continue
            vals = list(values[name])
            for dst, src in sources.items():
                vals[dst] = vals[src]
            value = collate(vals)
            if isinstance(value, torch.Tensor) and self.settings.device.type == "cuda":  # with the labels
                value = value.pin_memory().to(self.settings.device, non_blocking=True)
            batch[name] = value
        return batch

    def _windows(self, plan, indices: np.ndarray, values: dict | None = None):
        """What the decoder is asked for samples `indices` in `plan`'s epoch: their crop windows, or for detection
        the request its geometry is drawn from (both functions of the seed, the epoch and each sample's id), with
        each sample's encoded mask (`values`, SampleFields.split's) for segmentation."""
        s = self.settings
        if self.table.targets is not None:
            masks = values[s.mask] if s.mask is not None else None
            return DetectRequest(ids=np.asarray(indices, dtype=np.int64), epoch=plan.epoch, masks=masks,
                                 pil=self._pil(indices))
        return crop_windows(self.table.widths[indices], self.table.heights[indices], indices, seed=s.seed,
                            epoch=plan.epoch, train=s.train, image_size=s.image_size, pil=self._pil(indices))

    def _pil(self, indices) -> np.ndarray | None:
        """The batch's `pil_only` flags, None when none is set (the decoders then route nothing)."""
        p = self.table.pil_only
        if p is None:
            return None
        got = p[np.asarray(indices, dtype=np.int64)]
        return got if got.any() else None

    def _finish_detection(self, plan, k: int, result, replaced: dict) -> dict:
        """The detection batch dict on the device. `valid` is False where a position holds no sample of its own in
        evaluation (padding, a replaced sample): the mask of images to score, as IGNORE_INDEX is for labels."""
        batch = dict(result.targets, images=result.images)
        valid = torch.ones(len(result.images), dtype=torch.bool)
        if not self.settings.train:
            padded = plan.padded[k * plan.batch_size:(k + 1) * plan.batch_size]
            valid &= ~torch.from_numpy(np.asarray(padded, dtype=bool).copy())
            if replaced:
                valid[list(replaced)] = False
        batch["valid"] = valid
        semantic = self.settings.task == "semantic"
        if self.settings.device.type == "cuda":
            # What the model reads goes to the device; the bookkeeping (ids, sizes, scale, pad, valid) stays on the
            # host, where it is read without waiting for the GPU.
            batch = {name: v.pin_memory().to(self.settings.device, non_blocking=True)
                     if name in _ON_DEVICE and v.device.type == "cpu" else v for name, v in batch.items()}
        if semantic:  # class ids travel as 8 or 16 bits; losses take int64 (and torch fills no uint16 by a mask)
            batch["masks"] = masks = batch["masks"].long()
            if not bool(valid.all()):  # in evaluation only what is scored has labelled pixels
                masks[(~valid).to(masks.device)] = self.settings.ignore_index
        return batch

    def _untrusted(self, indices, samples, digests=None) -> dict[int, tuple[str, str]]:
        """The samples no decoder may see, by position, with (code, detail). Bytes that match the checksum pack
        stored are the bytes pack validated. Where no checksum is checked (the dataset has none, or
        verify_checksums=False), JPEGs and PNGs that pack would not have stored as they are (a broken header or
        chunk, no end marker) are held back: DALI's decoders can crash the process on such bytes, and its GPU decoder
        returns a cut JPEG's missing rows as pixels without an error (docs/design/decoders.md#untrusted-bytes)."""
        if self.table.bad_checksums is not None:
            return {p: ("checksum", "its bytes do not match the checksum in the sample table")
                    for p in self.table.bad_checksums(indices, samples, digests=digests)}
        # `pil_only` samples go to PIL alone, which refuses bad bytes with an error: pack stored some that way on
        # purpose (a PNG whose chunks only PIL reads, docs/decode-contract.md)
        pil = self._pil(indices)
        return {p: (DECODE_ERROR, why) for p, why in jpeg.header_failures(samples) if pil is None or not pil[p]}

    def _fill_from_epoch(self, plan, k, decoder, indices, exc: CorruptSampleError, bad):
        """Every sample of batch k is bad (skip mode): fill the batch with one good sample taken from the rest of
        the epoch (the next ones in the plan), so the run goes on and the batch keeps its shape. Past the plan's end
        the candidates are the dataset's samples in order, not the plan's first ones: a resumed plan starts where
        the run stopped, so its first samples are not the uninterrupted plan's, and the last batch would be filled
        with another sample after a resume (the candidates must be the same for the same rest of the epoch)."""
        s = self.settings
        n = len(indices)
        replaced = [(p, *bad[p]) if p in bad else (p, code, detail)
                    for p, code, detail in zip(exc.positions, exc.codes, exc.details)]
        # Enough of each to find _FILL_CANDIDATES outside the batch, never the whole epoch or dataset (a sort of
        # hundreds of millions of ids where one batch failed).
        want = _FILL_CANDIDATES + n
        rest = plan.indices[min((k + 1) * plan.batch_size, len(plan.indices)):][:want]
        first_ids = np.arange(min(len(self.table.widths), want + len(rest)), dtype=np.int64)
        candidates = np.concatenate((rest, first_ids))
        candidates = candidates[~np.isin(candidates, indices)]
        _, first = np.unique(candidates, return_index=True)  # each sample once, in that order
        candidates = candidates[np.sort(first)][:_FILL_CANDIDATES]
        for c in candidates.tolist():
            data, err = self._read_one(c)
            values = None
            if not err and self.table.fields is not None:
                (data,), one_values, field_bad = self.table.fields.split(np.asarray([c]), [data])
                err = field_bad.get(0)
                values = {name: v * n for name, v in one_values.items()}  # n copies, as of its pixels
            if err or self._untrusted(np.asarray([c]), [data]):
                continue
            everywhere = {p: -1 for p in range(n)}
            try:
                if self.table.targets is not None:  # n copies of it: the detection geometry gives each its own
                    many = decoder([data] * n, self._windows(plan, np.full(n, c, dtype=np.int64), values))
                    return self._with_fields(self._finish_detection(plan, k, many, everywhere), values, {}), replaced
                one = decoder([data], self._windows(plan, np.asarray([c])))
            except CorruptSampleError:
                continue
            images = one.images.expand(n, *one.images.shape[1:]).contiguous(
                memory_format=torch.channels_last if s.channels_last else torch.contiguous_format)
            labels = self._finish_labels(plan, k, self.table.labels[torch.full((n,), c, dtype=torch.int64)],
                                         everywhere)
            return self._classification(images, labels, values, {}), replaced
        reasons = "; ".join(f"{self._names(indices, [p])}: {code}: {detail}" for p, code, detail in replaced[:4])
        advice = ("the samples lack members `fields` asks for (Loader(path).dataset.fields lists them)"
                  if all(code in (MISSING_FIELD, BAD_FIELD) for _, code, _ in replaced)
                  else "check the dataset with `fastfeed verify`")
        raise LoaderError(f"batch {k} of epoch {plan.epoch}: every sample is bad ({reasons}"
                          f"{'; ...' if len(replaced) > 4 else ''}) and none of {len(candidates)} other samples of "
                          f"the epoch is usable either; {advice}")

    def _finish_labels(self, plan, k: int, labels: torch.Tensor, replaced: dict) -> torch.Tensor:
        """In evaluation a position that holds no sample of its own (padding, a replaced sample) is labelled
        IGNORE_INDEX, so every sample is scored exactly once. Then to the device."""
        if not self.settings.train:
            padded = plan.padded[k * plan.batch_size:(k + 1) * plan.batch_size]
            ignore = torch.from_numpy(np.asarray(padded, dtype=bool).copy())
            if replaced:
                ignore[list(replaced)] = True
            labels[ignore] = IGNORE_INDEX
        if self.settings.device.type == "cuda":
            labels = labels.pin_memory().to(self.settings.device, non_blocking=True)
        return labels

    def _read_one(self, i: int):
        try:
            return np.frombuffer(self.table.read(i), dtype=np.uint8), None
        except (OSError, ValueError) as e:
            return _EMPTY, f"{type(e).__name__}: {e}"

    def _names(self, indices, positions) -> str:
        names = [self._name(int(indices[p])) for p in list(positions)[:8]]
        return ", ".join(names) + (" ..." if len(list(positions)) > 8 else "")

    def _name(self, i: int) -> str:
        """Sample i as messages name it: its file and key (FILE:KEY, as rejected.jsonl's sources), or its key."""
        key = str(self.table.keys[i])
        return key if self.table.file_of is None else f"{self.table.file_of(i)}:{key}"

    def report(self, replaced) -> None:
        """Count and log a batch's replaced samples (`produce`'s last item) as the batch is handed to the loop (see
        the module docstring); called by the consumer's thread only."""
        for code, i, detail in replaced:
            self.stats.skip(code, key=str(self.table.keys[i]),
                            file=None if self.table.file_of is None else self.table.file_of(i))
            if i not in self._logged and len(self._logged) < 1000:
                self._logged.add(i)
                log.warning("fastfeed: sample %s replaced by another sample of its batch (%s: %s)", self._name(i),
                            code, detail)
