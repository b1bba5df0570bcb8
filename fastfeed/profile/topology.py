"""How the GPUs of this host are linked, from `nvidia-smi topo -m`: NVLink (`NV#`) or PCIe paths (`PIX`, `PXB`, `PHB`,
`NODE`, `SYS`). The communication finding says it, since a gradient all-reduce over PCIe through the CPU is several
times slower than over NVLink, and no setting of the training script changes that.
"""
from __future__ import annotations

import re
import shutil
import subprocess

__all__ = ["gpu_links", "parse_topology", "describe_links"]

_PCIE = {"PIX": "one PCIe switch", "PXB": "several PCIe switches", "PHB": "a PCIe host bridge (the CPU)",
         "NODE": "PCIe host bridges within a NUMA node", "SYS": "PCIe and the link between NUMA nodes"}


def gpu_links(timeout: float = 5.0) -> dict | None:
    """{"gpus": n, "links": sorted link labels between distinct GPUs} of this host, or None (no nvidia-smi, one
    GPU, or an answer it could not read)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=timeout).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_topology(out)


def parse_topology(text: str) -> dict | None:
    """The matrix of `nvidia-smi topo -m` (a header of GPU names, then a row per device), or None."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in text.splitlines()]  # it colours the header
    header = next((line.split() for line in lines if line.split()[:1] == ["GPU0"] and "X" not in line.split()),
                  None)
    if not header:
        return None
    gpus = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    links = set()
    for line in lines:
        cells = line.split()
        if cells[:1] and cells[0] in gpus and "X" in cells and len(cells) > len(gpus):  # a row, not the header
            links.update(c for c in cells[1:1 + len(gpus)] if c != "X")
    if len(gpus) < 2 or not links:
        return None
    return {"gpus": len(gpus), "links": sorted(links)}


def describe_links(topo: dict) -> str:
    """One line: how the GPUs are linked, the slowest path first."""
    links = topo["links"]
    pcie = [lk for lk in links if not lk.startswith("NV")]
    if not pcie:
        return f"{topo['gpus']} GPUs, every pair linked by NVLink ({', '.join(links)})"
    paths = ", ".join(f"{lk} ({_PCIE.get(lk, lk)})" for lk in pcie)
    return f"{topo['gpus']} GPUs, pairs linked through {paths}" + (
        "" if len(pcie) < len(links) else ": no NVLink")
