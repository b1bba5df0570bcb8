"""What a `fastfeed.Loader` is built from, each from explicit inputs and holding no reference to the Loader (a run's
workers call the functions these return): the sample table the epochs read through, the decoder factory, the epoch
planner and, for a dataset at a URL, the shard fetcher. loader.py composes them; epoch.py runs them."""
from __future__ import annotations

import numpy as np
import torch

from fastfeed import sampling
from fastfeed.decode import build_decoder, oriented_size
from fastfeed.detect.decoder import DetectDecoder
from fastfeed.detect.gpu import GpuDetectDecoder
from fastfeed.formats import integrity, read_targets
from fastfeed.loader.assemble import SampleTable
from fastfeed.targets import BOX_TASKS, GEOMETRY_TASKS, build_targets

__all__ = ["sample_table", "decoder_factory", "epoch_planner", "shard_fetcher"]


def sample_table(ds, settings, extents, fields) -> SampleTable:
    """What the epochs know of each sample of `ds`: labels, oriented sizes, keys, detection targets, how to read one
    again (the bytes the ring would have read), and the checksum check when the Loader verifies them."""
    check = None
    if settings.verify_checksums and getattr(ds, "checksums", None) is not None:
        def check(indices, samples, digests=None):
            return integrity.bad_checksums(ds, indices, samples, digests=digests)
    tags = getattr(ds, "orientations", None)
    widths, heights = oriented_size(ds.widths, ds.heights, tags, settings.orientation)
    task = settings.task
    targets = read_targets(ds, widths, heights) if task in BOX_TASKS else None
    if task == "semantic":  # the detection geometry, no objects: the masks are read with the images
        targets = build_targets([None] * len(ds), widths, heights)
    read = lambda i: ds.read(i, check=False)  # noqa: E731 - the epoch checks checksums, to count a mismatch
    if fields is not None:  # what the ring would have read: the span of the image and its members
        read = lambda i: ds.read_range(i, int(extents.offset[i]), int(extents.size[i]))  # noqa: E731
    return SampleTable(labels=torch.from_numpy(np.ascontiguousarray(ds.labels, dtype=np.int64)),
                       widths=np.asarray(widths), heights=np.asarray(heights), keys=ds.keys, read=read,
                       bad_checksums=check, targets=targets, fields=fields,
                       pil_only=np.asarray(getattr(ds, "pil_only", np.zeros(len(ds), dtype=bool)), dtype=bool),
                       orientations=None if settings.orientation != "exif" or tags is None else np.asarray(tags),
                       file_of=getattr(ds, "file_of", None))


def decoder_factory(settings, table: SampleTable, climber, stats):
    """new(index) -> pipeline number `index`'s decoder. Each one built is counted in `pipelines_built`: fastfeed
    bench notes a build inside its timed steps."""
    def new(index: int):
        if settings.task in GEOMETRY_TASKS:
            kind = GpuDetectDecoder if settings.decoder == "dali" else DetectDecoder
            decoder = kind.from_settings(settings, table.targets, table.widths, table.heights, table.orientations)
        else:
            decoder = build_decoder(settings, index=index, climber=climber)
        stats.add("pipelines_built")
        return decoder
    return new


def epoch_planner(n: int, settings, world, shard_of):
    """plan(epoch, resume) -> sampling.EpochPlan of this rank over `n` samples."""
    def plan(epoch: int, resume: dict | None):
        return sampling.plan_epoch(n, seed=settings.seed, epoch=epoch, world=world, batch_size=settings.batch_size,
                                   drop_last=settings.drop_last, shuffle=settings.shuffle, order=settings.order,
                                   shard_of=shard_of, resume=resume)
    return plan


def shard_fetcher(ds, batch_size: int, slots: int):
    """fetch(indices, stop) for a dataset at a URL: what keeps the ring's read-ahead window in the local cache."""
    from fastfeed.remote import epoch_fetch

    return lambda indices, stop: epoch_fetch(ds, indices, batch_size, slots, stop)
