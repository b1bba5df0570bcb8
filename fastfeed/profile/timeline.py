"""`fastfeed profile --plot FILE.png`: the measured window as stacked bars, one per step and one row per process, each
bar cut into the parts of the report's table (data, h2d, forward+other, backward, optimizer, comm), for people who
would rather look than read: a data-bound run shows tall data segments, a straggling rank a taller row."""
from __future__ import annotations

from fastfeed.profile.report import PARTS

__all__ = ["plot_timeline", "COLOURS"]

# One colour per part, in PARTS order (matplotlib's tab10, data first in red: the part this tool is about).
COLOURS = {"data": "#d62728", "h2d": "#ff7f0e", "forward+other": "#1f77b4", "backward": "#2ca02c",
           "optimizer": "#9467bd", "comm": "#8c564b"}
_MAX_ROWS = 8  # processes drawn (the slowest first beyond that many)


def plot_timeline(summary: dict, path: str) -> None:
    """Write the PNG of `summary` (report.summarize's) to `path`. Needs matplotlib (`pip install matplotlib`)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ValueError("--plot needs matplotlib (pip install matplotlib)") from e
    procs = summary["processes"]
    if not procs:
        raise ValueError("no step was measured: nothing to plot")
    if len(procs) > _MAX_ROWS:
        procs = sorted(procs, key=lambda p: -p["s_per_step"])[:_MAX_ROWS]
    fig, axes = plt.subplots(len(procs), 1, figsize=(10, 1.9 * len(procs) + 1.0), sharex=True, squeeze=False)
    for ax, p in zip(axes[:, 0], procs):
        steps = p["per_step"]
        x = range(len(steps))
        bottom = [0.0] * len(steps)
        for part in PARTS:
            ms = [1e3 * s[part] for s in steps]
            ax.bar(x, ms, bottom=bottom, color=COLOURS[part], width=0.85, label=part)
            bottom = [b + v for b, v in zip(bottom, ms)]
        ax.set_ylabel(f"rank {p['rank']}\nms / step")
        ax.spines[["top", "right"]].set_visible(False)
    axes[0, 0].legend(ncol=len(PARTS), loc="lower left", bbox_to_anchor=(0, 1.02), frameon=False, fontsize=8)
    axes[-1, 0].set_xlabel("measured step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
