"""A YOLO dataset's data.yaml: class names (`names:` a list or a {id: name} map, or `nc:` alone), `kpt_shape`, and
the split keys (`train:`, `val:`, `test:`) resolved to paths as ultralytics' check_det_dataset resolves them; also a
data.yaml kept apart from its dataset as a source (ultralytics' coco128.yaml). PyYAML reads it when installed, else a
small subset of YAML that data.yaml files hold (pyyaml is not a fastfeed dependency)."""
from __future__ import annotations

import os

_DATA_YAML = ("data.yaml", "dataset.yaml", "data.yml")  # a dataset's names (and its split folders), first found
_SPLIT_KEYS = ("train", "val", "test")  # the data.yaml keys naming split folders


def _read_yaml(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: unreadable ({e})") from None


def yaml_source(yaml_path: str, split: str | None, classes: str | None) -> tuple[str, str, str]:
    """(root, split folder, classes) of a data.yaml kept apart from its dataset and given as SRC, as ultralytics
    takes `data=coco128.yaml`: the folder its `path:` names (from the working directory, then from the YAML's folder,
    as ultralytics tries them before its datasets folder), the images/NAME its SPLIT key names, and the YAML's class
    names unless `classes` gives others. A ValueError says what to pass instead where it names no such folder."""
    text = _read_yaml(yaml_path)
    base = _yaml_value(text, "path", yaml_path)
    base = os.path.expanduser(base) if isinstance(base, str) and base else os.path.dirname(yaml_path)
    root = next((os.path.abspath(f) for f in (base, os.path.join(os.path.dirname(yaml_path), base))
                 if os.path.isdir(f)), None)
    value = _yaml_value(text, split, yaml_path) if split in _SPLIT_KEYS else None
    folder = os.path.basename(os.path.normpath(value)) if isinstance(value, str) and value else None
    if root is None or folder is None or not os.path.isdir(os.path.join(root, "images", folder)):
        raise ValueError(f"{yaml_path}: a data.yaml; fastfeed reads one as SRC when its path: names the dataset's "
                         f"folder and --split one of {', '.join(_SPLIT_KEYS)} names an images/NAME folder there "
                         f"(here: path {base!r}, --split {split!r}); else pack the folder holding images/ and "
                         f"labels/ with --split NAME --classes {yaml_path}")
    return root, folder, classes if classes is not None else yaml_path


def _yaml_split_paths(root: str) -> dict[str, str]:
    """{key: path} of the train/val/test keys of ROOT's data.yaml naming one path. Resolved as ultralytics'
    check_det_dataset resolves them: against `path:`, else data.yaml's folder, and a value starting with "../" that
    names nothing there is tried without it. Unlike ultralytics, a relative `path:` is taken from data.yaml's
    folder, not the working directory, and one naming no folder is ignored (an export made elsewhere): a pack does
    not depend on where it runs."""
    yaml_path = next((p for p in (os.path.join(root, n) for n in _DATA_YAML) if os.path.isfile(p)), None)
    if yaml_path is None:
        return {}
    text = _read_yaml(yaml_path)
    base = _yaml_value(text, "path", yaml_path)
    base = os.path.join(root, os.path.expanduser(base)) if isinstance(base, str) and base else root
    base = base if os.path.isdir(base) else root
    found = {}
    for key in _SPLIT_KEYS:
        value = _yaml_value(text, key, yaml_path)
        if value is None and key == "val":  # ultralytics renames it to `val`
            value = _yaml_value(text, "validation", yaml_path)
        if not isinstance(value, str) or not value:
            continue
        path = os.path.normpath(os.path.join(base, value))
        if not os.path.exists(path) and value.startswith("../"):
            path = os.path.normpath(os.path.join(base, value[3:]))
        found[key] = path
    return found


def _yaml_value(text: str, key: str, where: str):
    """A top-level key's value in a YOLO data.yaml, or None. PyYAML when installed, else a small subset of YAML (block
    and flow lists and maps of scalars: what data.yaml files hold); pyyaml is not a fastfeed dependency."""
    try:
        import yaml
    except ImportError:
        return _tiny_yaml_value(text, key)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{where}: not valid YAML ({e})") from None
    return doc.get(key) if isinstance(doc, dict) else None


def parse_yaml_kpt_shape(text: str, where: str = "data.yaml") -> tuple[int, int] | None:
    """`kpt_shape: [K, D]` of a YOLO pose data.yaml (K keypoints of D values: x, y and, with D = 3, visibility), or
    None when it has none."""
    raw = _yaml_value(text, "kpt_shape", where)
    if raw is None:
        return None
    if not (isinstance(raw, list) and len(raw) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                             for v in raw) and raw[0] > 0 and raw[1] in (2, 3)):
        raise ValueError(f"{where}: kpt_shape must be [keypoints, 2 or 3], got {raw!r}")
    return raw[0], raw[1]


def parse_yaml_names(text: str, where: str = "data.yaml") -> list[str] | None:
    """The class names of a YOLO data.yaml in class order: `names:` (a {id: name} map becomes a list; missing ids get
    their number as name), else "0" .. "nc - 1" from `nc:` alone, or None when it has neither. An `nc` other than
    the number of classes `names` gives is an error, as in ultralytics' check_det_dataset: which one is right
    decides which labels are unknown classes."""
    raw = _yaml_value(text, "names", where)
    nc = _yaml_value(text, "nc", where)
    if nc is not None and (isinstance(nc, bool) or not isinstance(nc, int) or nc <= 0):
        raise ValueError(f"{where}: 'nc' must be a positive number of classes, got {nc!r}")
    if raw is None:
        return None if nc is None else [str(i) for i in range(nc)]
    if isinstance(raw, dict):
        try:
            ids = {int(k): str(v) for k, v in raw.items()}
        except (TypeError, ValueError):
            raise ValueError(f"{where}: names map keys must be class ids (integers)") from None
        if not ids or min(ids) < 0:
            raise ValueError(f"{where}: names map needs class ids 0, 1, ...")
        names = [ids.get(i, str(i)) for i in range(max(ids) + 1)]
    elif isinstance(raw, list) and raw:
        names = [str(v) for v in raw]
    else:
        raise ValueError(f"{where}: 'names' must be a non-empty list or a map {{id: name}}")
    if nc is not None and nc != len(names):
        raise ValueError(f"{where}: 'nc: {nc}' and 'names' ({len(names)} classes) disagree: fix one of them")
    return names


def _tiny_yaml_names(text: str):
    return _tiny_yaml_value(text, "names")


def _tiny_yaml_value(text: str, key: str):
    lines = [_strip_comment(line) for line in text.splitlines()]
    for n, line in enumerate(lines):
        if not line.startswith(key + ":"):  # top level only: no indentation
            continue
        inline = line[len(key) + 1:].strip()
        if inline:
            return _flow(inline)
        items: list = []
        mapping: dict = {}
        for sub in lines[n + 1:]:
            if not sub.strip():
                continue
            if not sub[0].isspace() and not sub.startswith("-"):
                break  # the next top-level key
            s = sub.strip()
            if s.startswith("- ") or s == "-":
                items.append(_scalar(s[1:].strip()))
            elif ":" in s:
                k, v = s.split(":", 1)
                mapping[_scalar(k.strip())] = _scalar(v.strip())
        return mapping if mapping else items
    return None


def _strip_comment(line: str) -> str:
    """`line` without a trailing '# comment' (outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def _flow(s: str):
    """A flow list `[a, 'b c']` or map `{0: a, 1: b}` of scalars (no nesting), or one scalar."""
    if s[:1] in "[{" and s[-1:] in "]}":
        parts = [p.strip() for p in _split_commas(s[1:-1]) if p.strip()]
        if s[0] == "[":
            return [_scalar(p) for p in parts]
        out = {}
        for p in parts:
            k, _, v = p.partition(":")
            out[_scalar(k.strip())] = _scalar(v.strip())
        return out
    return _scalar(s)


def _split_commas(s: str) -> list[str]:
    out, cur, quote = [], [], None
    for ch in s:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ",":
            out.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    out.append("".join(cur))
    return out


def _scalar(s: str):
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    if s.lstrip("-").isdigit():
        return int(s)
    return s
