"""`fastfeed bench --plot FILE.png`: throughput over steps and the data-wait distribution, one series per loader."""
from __future__ import annotations

import os

__all__ = ["plot_report"]


def plot_report(report: dict, path: str | os.PathLike) -> None:
    """Write a two-panel PNG: samples/s per step (left) and a histogram of per-step wait in ms (right)."""
    import matplotlib

    matplotlib.use("Agg", force=True)  # no display needed; also safe inside a headless training container
    import matplotlib.pyplot as plt

    fig, (ax_tp, ax_wait) = plt.subplots(1, 2, figsize=(11, 4))
    try:
        for name, r in report["loaders"].items():
            ps = r["per_step"]
            tput = [n / max(s, 1e-9) for n, s in zip(ps["samples"], ps["step_s"])]
            ax_tp.plot(range(1, len(tput) + 1), tput, label=f"{name} ({r['samples_per_s']:,.0f}/s)")
            waits_ms = [1e3 * w for w in ps["wait_s"]]
            ax_wait.hist(waits_ms, bins=min(30, max(5, len(waits_ms) // 2)), alpha=0.55,
                         label=f"{name} ({100 * r['wait_fraction']:.0f}% waiting)")
        ceiling = report["consumer"].get("compute_only_samples_per_s")
        if ceiling:
            ax_tp.axhline(ceiling, color="grey", linestyle="--", label="compute-only ceiling")
        ax_tp.set(title="throughput per step", xlabel="step", ylabel="samples/s")
        ax_tp.set_ylim(bottom=0)
        ax_wait.set(title="data wait per step", xlabel="ms blocked in next()", ylabel="steps")
        ax_tp.legend(fontsize=8)
        ax_wait.legend(fontsize=8)
        cfg = report.get("config", {})
        fig.suptitle(f"fastfeed bench: batch {cfg.get('batch_size')}, {cfg.get('image_size')}px, "
                     f"consumer {report['consumer']['name']}", fontsize=10)
        fig.tight_layout()
        fig.savefig(os.fspath(path), format="png", dpi=100)
    finally:
        plt.close(fig)
