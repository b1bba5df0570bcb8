"""`fastfeed bench --plot FILE.png`: throughput over steps and the data-wait distribution, one series per loader."""
from __future__ import annotations

import os

__all__ = ["plot_report", "format_rate", "shared_bins"]


def format_rate(x: float) -> str:
    """Samples/s with three significant digits at most, never rounded to an integer below 100: 1.7, 23.4, 1,234."""
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}" if x >= 1 else f"{x:.2g}"


def shared_bins(series: list[list[float]], max_bins: int = 30) -> list[float]:
    """One set of histogram bin edges for every series, so overlaid bars are comparable."""
    values = [v for s in series for v in s]
    if not values:
        return [0.0, 1.0]
    lo, hi = min(values), max(values)
    if hi <= lo:  # one value everywhere: one bin around it
        half = max(abs(lo) * 0.05, 0.5)
        return [lo - half, hi + half]
    n = min(max_bins, max(5, len(values) // 4))
    return [lo + (hi - lo) * i / n for i in range(n + 1)]


def plot_report(report: dict, path: str | os.PathLike) -> None:
    """Write a two-panel PNG: samples/s per step (left) and a histogram of per-step wait in ms (right)."""
    import matplotlib

    matplotlib.use("Agg", force=True)  # no display needed; also safe inside a headless training container
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_tp, ax_wait) = plt.subplots(1, 2, figsize=(11, 4))
    try:
        loaders = report["loaders"]
        waits_ms = {name: [1e3 * w for w in r["per_step"]["wait_s"]] for name, r in loaders.items()}
        bins = shared_bins(list(waits_ms.values()))
        for name, r in loaders.items():
            ps = r["per_step"]
            tput = [n / max(s, 1e-9) for n, s in zip(ps["samples"], ps["step_s"])]
            ax_tp.plot(range(1, len(tput) + 1), tput, marker="o" if len(tput) <= 20 else None,
                       label=f"{name} ({format_rate(r['samples_per_s'])} samples/s)")
            ax_wait.hist(waits_ms[name], bins=bins, alpha=0.55,
                         label=f"{name} ({100 * r['wait_fraction']:.1f}% waiting)")
        ceiling = report["consumer"].get("compute_only_samples_per_s")
        if ceiling:
            ax_tp.axhline(ceiling, color="grey", linestyle="--",
                          label=f"resident-data ceiling ({format_rate(ceiling)} samples/s)")
        ax_tp.set(title="throughput per step", xlabel="step", ylabel="samples/s")
        ax_tp.set_ylim(bottom=0)
        ax_tp.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax_wait.set(title="data wait per step", xlabel="ms blocked in next()", ylabel="steps")
        ax_wait.yaxis.set_major_locator(MaxNLocator(integer=True))  # a count of steps
        ax_tp.legend(fontsize=8)
        ax_wait.legend(fontsize=8)
        cfg = report.get("config", {})
        fig.suptitle(f"fastfeed bench: batch {cfg.get('batch_size')}, {cfg.get('image_size')}px, "
                     f"{cfg.get('dtype')}, {cfg.get('device')}, consumer {report['consumer']['name']}", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.fspath(path), format="png", dpi=100)
    finally:
        plt.close(fig)
