"""Loss-curve PNGs from a run's ``metrics.jsonl`` (matplotlib, headless ``Agg`` backend)."""

from __future__ import annotations

import json
import pathlib


def read_metrics(path) -> list[dict]:
    """The rows of a ``metrics.jsonl`` file (blank lines skipped)."""
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()
            if line.strip()]


def loss_curve(metrics, png, *, title: str, keys=("loss",), extra: str | None = None,
               smooth: int = 0) -> pathlib.Path:
    """Plot ``keys`` of every row against ``step`` (log y axis) into ``png``; ``extra``: one
    more key (e.g. a PSNR) on a second y axis, drawn where rows have it. ``smooth`` > 1 adds a
    running mean over that many logged rows for the first key."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = read_metrics(metrics)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for k in keys:
        pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None and r[k] > 0]
        if pts:
            s, v = zip(*pts)
            ax.plot(s, v, label=k, lw=1, alpha=0.5 if smooth > 1 and k == keys[0] else 1)
            if smooth > 1 and k == keys[0] and len(v) >= smooth:
                run = np.convolve(v, np.ones(smooth) / smooth, mode="valid")
                ax.plot(s[smooth - 1:], run, label=f"{k} (mean of {smooth})", lw=2)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if extra:
        pts = [(r["step"], r[extra]) for r in rows if r.get(extra) is not None]
        if pts:
            ax2 = ax.twinx()
            s, v = zip(*pts)
            ax2.plot(s, v, "o-", color="black", label=extra, ms=3)
            ax2.set_ylabel(extra)
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="upper right", fontsize=8)
    fig.tight_layout()
    png = pathlib.Path(png)
    fig.savefig(png)
    plt.close(fig)
    return png


__all__ = ["read_metrics", "loss_curve"]
