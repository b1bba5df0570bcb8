"""The resume journal of an unfinished pack: `OUT/.fastfeed-pack/journal.jsonl`.

Protocol: line 1 is the plan fingerprint (source, options, entry list hash); every later line is one durable
commit `{"pos", "shard", "rows", "rejected"}`, appended and fsynced only AFTER the data it describes is durable
(a shard renamed to its final name, or an LMDB transaction committed). `pos` is how far into the plan the commit
reaches. A kill can therefore lose at most the work since the last commit, and a half-written last line (killed
mid-append) is ignored. The journal is deleted after the manifest is written.
"""
from __future__ import annotations

import json
import os
import shutil

from fastfeed.pack.writers import fsync_dir

__all__ = ["Journal", "JOURNAL_DIR"]

JOURNAL_DIR = ".fastfeed-pack"


class Journal:
    def __init__(self, folder: str):
        self.dir = os.path.join(folder, JOURNAL_DIR)
        self.path = os.path.join(self.dir, "journal.jsonl")
        self._f = None

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def start(self, fingerprint: dict) -> None:
        os.makedirs(self.dir, exist_ok=True)
        with open(self.path, "w", encoding="ascii") as f:
            f.write(json.dumps({"fingerprint": fingerprint}, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(self.dir)

    def load(self) -> tuple[dict, list[dict]]:
        """(fingerprint, committed entries); a torn last line is dropped."""
        with open(self.path, encoding="ascii", errors="replace") as f:
            lines = f.read().split("\n")
        try:
            fingerprint = json.loads(lines[0])["fingerprint"]
        except (ValueError, KeyError, IndexError):
            raise ValueError(f"{self.path}: unreadable resume journal; re-run with --overwrite") from None
        commits = []
        for line in lines[1:]:
            try:
                commits.append(json.loads(line))
            except ValueError:
                break  # torn write at the moment of the kill: everything after it is lost work
        return fingerprint, commits

    def rewrite(self, fingerprint: dict, commits: list[dict]) -> None:
        """Drop a torn tail so later appends start on a clean line."""
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(json.dumps({"fingerprint": fingerprint}, sort_keys=True) + "\n")
            for c in commits:
                f.write(json.dumps(c, ensure_ascii=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def append(self, commit: dict) -> None:
        if self._f is None:
            self._f = open(self.path, "a", encoding="ascii")
        self._f.write(json.dumps(commit, ensure_ascii=True) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        """Close the append handle (an interrupted pack keeps its journal for --resume)."""
        if self._f is not None:
            self._f.close()
            self._f = None

    def remove(self) -> None:
        self.close()
        shutil.rmtree(self.dir, ignore_errors=True)
