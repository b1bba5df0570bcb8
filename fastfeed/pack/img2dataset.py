"""img2dataset's `files` output as a pack source: `ROOT/00000/000000012.jpg` beside `000000012.txt` (the caption)
and `000000012.json` (the row's url, key, sizes, ...), one numbered folder per shard it downloaded, with
`00000_stats.json` (and `00000.parquet`) at the top.

Each image becomes a sample with its caption as the member `KEY.txt`, stored byte for byte, and its JSON as the
sample's metadata (`KEY.json`): the same members img2dataset's own `webdataset` output has, so `Loader(fields=["txt",
"json"])` reads either. Recognised under `--source auto` by the `_stats.json` files beside numbered folders. A caption
or JSON without its image, an image without its caption, and a JSON that does not parse are rejections naming the
file; labels are -1 (no classes). A folder without numbered shard folders is refused, naming img2dataset's
`webdataset` output (`00000.tar`, ...) when it is that: `fastfeed index` adopts those shards in place.
"""
from __future__ import annotations

import json
import os
import re

from fastfeed.pack.sources import Source, SourceEntry, _listdir

__all__ = ["looks_like_img2dataset", "scan_img2dataset"]

_SHARD = re.compile(r"^\d+$")
_STATS = re.compile(r"^\d+_stats\.json$")
_SHARD_TAR = re.compile(r"^\d+\.tar$")
_SIDECARS = (".txt", ".json")


def looks_like_img2dataset(root: str) -> bool:
    """Numbered folders with img2dataset's `NNNNN_stats.json` beside them."""
    try:
        names = os.listdir(root)
    except OSError:
        return False
    return any(_STATS.match(n) for n in names) and any(_SHARD.match(n) and os.path.isdir(os.path.join(root, n))
                                                       for n in names)


def scan_img2dataset(root: str) -> Source:
    src = Source(root, "img2dataset", [], [], {}, fields=("txt",))
    listing = _listdir(root, src)
    if not any(is_dir and _SHARD.match(name) for name, is_dir in listing):
        _refuse_other_output(root, [name for name, is_dir in listing if not is_dir])
    for shard, is_dir in listing:
        if not (is_dir and _SHARD.match(shard)):
            continue  # the stats, parquet and other files img2dataset writes at the top
        folder = os.path.join(root, shard)
        stems: dict[str, dict[str, str]] = {}
        images: dict[str, list[str]] = {}
        for name, sub_is_dir in _listdir(folder, src):
            if sub_is_dir:
                src.rejected.append({"path": os.path.join(folder, name), "reason": "folder inside an img2dataset "
                                     "shard folder"})
                continue
            stem, ext = os.path.splitext(name)
            kind = ext.lower() if ext.lower() in _SIDECARS else "image"
            stems.setdefault(stem, {})[kind] = name
            if kind == "image":
                images.setdefault(stem, []).append(name)
        for stem in sorted(stems):
            files = stems[stem]
            where = {k: os.path.join(folder, v) for k, v in files.items()}
            if "image" not in files:
                for path in where.values():
                    src.rejected.append({"path": path, "reason": "no image beside it"})
                continue
            if len(images[stem]) > 1:  # which of them the caption and JSON describe is not written anywhere
                names = ", ".join(sorted(images[stem]))
                for name in sorted(images[stem]):
                    src.rejected.append({"path": os.path.join(folder, name), "reason": f"files {names} share the "
                                         "stem its caption and JSON are named by: which one they describe is unknown"})
                continue
            if ".txt" not in files:
                src.rejected.append({"path": where["image"], "reason": "no caption (.txt) beside it"})
                continue
            try:  # a caption is text: one that is not UTF-8 would pack, then fail as a bad record in every epoch
                with open(where[".txt"], "rb") as f:
                    f.read().decode("utf-8")
            except (OSError, UnicodeDecodeError) as e:
                src.rejected.append({"path": where[".txt"], "reason": f"unreadable caption: {e}"})
                continue
            meta = None
            if ".json" in files:
                try:
                    with open(where[".json"], encoding="utf-8") as f:
                        meta = json.load(f)
                    if not isinstance(meta, dict):
                        raise ValueError("not a JSON object")
                except (OSError, ValueError) as e:
                    src.rejected.append({"path": where[".json"], "reason": f"unreadable JSON: {e}"})
                    continue
            src.entries.append(SourceEntry(where["image"], os.path.join(shard, files["image"]), -1, meta,
                                           members=(("txt", where[".txt"]),)))
    return src


def _refuse_other_output(root: str, files: list[str]) -> None:
    """`root` has no numbered shard folder: say which output it is instead."""
    tars = [n for n in files if _SHARD_TAR.match(n)]
    if tars:  # its images are tar members, not files: the shards are adopted where they lie, not packed again
        raise ValueError(f"{root} holds img2dataset's webdataset output (output_format=\"webdataset\": {tars[0]}, "
                         f"...): its shards are WebDataset already; adopt them in place with `fastfeed index {root}` "
                         f"(--source img2dataset reads its \"files\" output)")
    raise ValueError(f"{root} is not img2dataset's \"files\" output: no numbered shard folders (00000/, 00001/, ...)")
