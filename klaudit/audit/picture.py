"""`check-grad --plot FILE.png`: where along the response the user's KL gradient and the reference's part.

For each audited row (the first MAX_PANELS), position t of the response on the x axis; on the y axis,
each sample's head gradient at position t projected on the reference's mean gradient direction (its
contribution to the push towards the reference), user's term against the Rao-Blackwellized reference:
the mean over samples and a band from the 10th to the 90th percentile, real (unmasked) positions only,
each sample weighted by its importance weight (the audit samples a proposal, not the policy).
matplotlib is the optional extra `plot`.
"""

from __future__ import annotations

import importlib.util

import torch

MAX_PANELS = 6
MATPLOTLIB_MISSING = "--plot needs matplotlib, which is not installed here: pip install 'klaudit[plot]'"


def matplotlib_importable() -> bool:
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def weighted_quantile(values: torch.Tensor, weights: torch.Tensor, level: float) -> float:
    """The smallest value whose share of the total weight at or below it reaches `level`."""
    order = torch.argsort(values)
    cumulative = torch.cumsum(weights[order], 0)
    index = int(torch.searchsorted(cumulative, level * cumulative[-1]).clamp(max=values.numel() - 1))
    return values[order][index].item()


def position_statistics(values: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor | None = None
                        ) -> tuple[list[float], list[float], list[float]]:
    """Per position: the weighted mean, 10th and 90th percentile of `values` [N, T] over the rows where mask is 1
    (weights [N], default equal; NaN where no row is real)."""
    weights = torch.ones(values.shape[0], dtype=torch.float64) if weights is None else weights.to(torch.float64)
    means, lows, highs = [], [], []
    for t in range(values.shape[1]):
        real = mask[:, t] > 0
        column, weight = values[:, t][real].to(torch.float64), weights[real]
        if column.numel() == 0 or not bool(weight.sum() > 0):
            means.append(float("nan"))
            lows.append(float("nan"))
            highs.append(float("nan"))
            continue
        means.append(((weight * column).sum() / weight.sum()).item())
        lows.append(weighted_quantile(column, weight, 0.1))
        highs.append(weighted_quantile(column, weight, 0.9))
    return means, lows, highs


def draw(curves: dict, path: str, *, title: str) -> None:
    """One panel per (mode, placement) of `curves` (klaudit.audit.montecarlo.Curves), saved to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = list(curves.items())[:MAX_PANELS]
    figure, axes = plt.subplots(len(shown), 1, figsize=(8, 2.6 * len(shown)), squeeze=False, sharex=True)
    for axis, ((mode, placement), curve) in zip(axes[:, 0], shown):
        mask, weights = torch.cat(curve.mask).cpu(), torch.cat(curve.weights).cpu()
        positions = list(range(mask.shape[1]))
        for values, label, color in ((curve.reference, "reference (Rao-Blackwellized)", "tab:green"),
                                     (curve.user, "your KL term", "tab:red")):
            mean, low, high = position_statistics(torch.cat(values).cpu(), mask, weights)
            axis.plot(positions, mean, color=color, label=label)
            axis.fill_between(positions, low, high, color=color, alpha=0.2)
        name = ", ".join(f"{key}={value}" for key, value in mode) or "-"
        axis.set_title(f"{name} as {placement}", fontsize=9)
        axis.axhline(0.0, color="grey", linewidth=0.5)
        axis.set_ylabel("gradient along\nthe reference's")
    axes[-1, 0].set_xlabel("response position t")
    axes[0, 0].legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
