"""`fastfeed inspect OUT`: print a packed dataset's manifest summary."""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["configure", "run", "summarize"]


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a packed dataset folder or URL")
    p.add_argument("--json", action="store_true", help="print the whole manifest as JSON")


_BOX_KEYS = ("clipped_boxes", "dropped_boxes")  # detection: counted in `changes`, shown on their own line


def summarize(m) -> str:
    st = m.image_stats
    failed = m.extra.get("jpeg_actions", {}).get("transcode_failed", 0)
    lines = [
        f"kind:        {m.kind} (format version {m.version}, {m.created_by})",
        f"samples:     {m.num_samples} in {len(m.shards)} file(s), {st['bytes']['total'] / 1e6:.1f} MB"
        f" (mean {st['bytes']['mean'] / 1e3:.1f} KB)",
        f"classes:     {len(m.classes)}" + (f" ({', '.join(m.classes[:5])}{', ...' if len(m.classes) > 5 else ''})"
                                            if m.classes else ""),
        f"image size:  width {st['width']['min']}-{st['width']['max']} (mean {st['width']['mean']:.0f}), "
        f"height {st['height']['min']}-{st['height']['max']} (mean {st['height']['mean']:.0f})",
        "jpeg mix:    " + (", ".join(f"{k} {v}" for k, v in m.jpeg_mix.items() if v) or "none"),
        (f"jpeg mode:   {m.options.get('jpeg_mode', '?')}; transcoded {m.transcoded}"
         + (f"; stored untouched after a failed transcode {failed}" if failed else "")
         + (f" ({m.options['jpeg_note']})" if m.options.get("jpeg_note") else "")
         if m.source_kind != "shards" else "shards:      indexed where they lie, never rewritten"
         + (f" ({m.data_root})" if m.data_root else "")),
        "changes:     " + (", ".join(f"{k} {v}" for k, v in sorted(m.changes.items()) if k not in _BOX_KEYS)
                             or "none")
        + "  (files stored differently from their source, by reason)",
        f"pil only:    {m.pil_only}  (stored as they are; only the decode contract's PIL decode reads them as it says, "
        "so every decoder path hands them to PIL)" if m.pil_only else "pil only:    0",
        f"rejected:    {m.rejected}",
        "integrity:   " + ("per-sample xxh3 checksums; samples.npz checksum in the manifest" if m.samples_xxh3
                           else f"format version {m.version}: no per-sample checksums (re-pack to add them)"),
        f"source:      {m.source} ({m.source_kind})",
    ]
    try:
        from fastfeed.image.transcode import hw_decoder_advice

        advice = hw_decoder_advice(m.jpeg_mix)
    except (ImportError, ValueError, KeyError):
        advice = None
    if advice:
        lines.append(f"advice:      {advice}")
    if m.fields:
        lacking = m.extra.get("without_field", {})
        shown = [f"{n} (missing in {lacking[n]})" if lacking.get(n) else n for n in m.fields]
        lines.insert(2, f"fields:      {', '.join(shown)}  (Loader(fields=[...]) skips a sample missing one)")
    if getattr(m, "task", "classify") == "detect":
        lines.insert(1, _detect_lines(m))
    elif getattr(m, "task", "classify") == "semantic":
        lines.insert(1, f"task:        semantic (each image's class-id mask in its .{', .'.join(m.fields)} member)")
    if getattr(m, "task", "classify") != "classify":
        lines.insert(2, "frame:       " + ("each image as displayed (its EXIF orientation applied)"
                                          if m.annotation_frame == "exif" else "the stored pixels (EXIF ignored)")
                     + ": the annotations' and the Loader's (fastfeed pack --orientation)")
    return "\n".join(lines)


def _detect_lines(m) -> str:
    ob = m.objects or {}
    per = ob.get("per_image", {})
    clipped, dropped = m.changes.get("clipped_boxes", 0), m.changes.get("dropped_boxes", 0)
    return "\n".join([
        f"task:        detect ({ob.get('objects', 0)} objects; annotations in each sample's .json member)",
        (f"objects:     {ob.get('images_with_objects', 0)} images with objects, "
         f"{ob.get('images_without_objects', 0)} without; per image min {per.get('min', 0)}, "
         f"mean {per.get('mean', 0)}, max {per.get('max', 0)}"),
        f"boxes:       the Loader clips {clipped} to the image and drops {dropped} (stored as the source gave them)",
    ])


def run(args: argparse.Namespace) -> int:
    from fastfeed.remote import read_manifest as load_manifest  # hook: also fsspec URLs (fastfeed/remote/)
    from fastfeed.types import DatasetError

    try:
        m = load_manifest(args.path)
    except DatasetError as e:
        print(f"fastfeed inspect: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(json.loads(m.to_json()), indent=2))
    else:
        print(summarize(m))
    return 0
