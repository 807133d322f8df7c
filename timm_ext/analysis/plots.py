"""Pictures of the analysis results, drawn like the papers' figures (matplotlib, Agg backend, imported lazily).

Each function takes the numbers a :mod:`timm_ext.analysis` function returns (or several runs' of them,
as ``{label: result}``), writes one PNG and returns its path. ``pip install "timm-ext[analysis]"``.
"""
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch

__all__ = [
    'plot_cka', 'plot_eigenvalues', 'plot_fourier', 'plot_landscape_1d', 'plot_landscape_2d', 'plot_layer_heads',
    'plot_paired_differences', 'plot_per_layer', 'plot_seed_curves', 'pyplot',
]

PathLike = Union[str, Path]


def pyplot():
    """matplotlib.pyplot on the Agg backend, or an ImportError that says what to install."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError('plots need matplotlib: pip install "timm-ext[analysis]"') from e
    matplotlib.use('Agg', force=True)
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def _shade(ax, kinds: Optional[Sequence[str]], kind: str = 'msa') -> None:
    """Grey spans over the points of ``kind`` (how-do-vits-work Fig. 8/9 shade the MSAs)."""
    for i, k in enumerate(kinds or ()):
        if k == kind:
            ax.axvspan(i - 0.5, i + 0.5, color='0.85', zorder=0)


def plot_layer_heads(
        runs: Mapping[str, torch.Tensor],
        path: PathLike,
        title: str,
        ylabel: str,
        bound: Optional[float] = None,
) -> Path:
    """[layers, heads] values per run: the mean over heads per layer, each head as a dot (CB paper Fig. 4/7)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (label, values) in enumerate(runs.items()):
        values = torch.as_tensor(values, dtype=torch.float64)
        layers = torch.arange(1, values.shape[0] + 1)
        color = f'C{i}'
        ax.plot(layers, values.mean(dim=1), marker='o', color=color, label=label)
        for h in range(values.shape[1]):
            ax.scatter(layers, values[:, h], s=8, color=color, alpha=0.35)
    if bound is not None:
        ax.axhline(bound, color='red', linestyle=':', label=f'log N = {bound:.2f}')
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel='layer', ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_per_layer(
        runs: Mapping[str, Mapping[str, float]],
        path: PathLike,
        title: str,
        ylabel: str,
        kinds: Optional[Sequence[str]] = None,
        spread: Optional[Mapping[str, Sequence[float]]] = None,
        log: bool = False,
) -> Path:
    """``{label: {point: value}}``: one line per run over the reading points, MSA points shaded grey."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * max(len(v) for v in runs.values())), 4))
    _shade(ax, kinds)
    names: List[str] = []
    for label, values in runs.items():
        names = list(values)
        y = list(values.values())
        ax.plot(range(len(y)), y, marker='o', label=label)
        if spread and label in spread:
            lo = [a - s for a, s in zip(y, spread[label])]
            hi = [a + s for a, s in zip(y, spread[label])]
            ax.fill_between(range(len(y)), lo, hi, alpha=0.2)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=60, ha='right', fontsize=7)
    if log:
        ax.set_yscale('log')
    ax.set(ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_fourier(curves: Mapping[str, torch.Tensor], path: PathLike, title: str = 'Relative log amplitude') -> Path:
    """Delta log amplitude from 0 to pi, one curve per reading point coloured by depth (how-do-vits-work Fig. 2a)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    cmap = plt.get_cmap('plasma')
    n = max(len(curves) - 1, 1)
    for i, (name, delta) in enumerate(curves.items()):
        delta = torch.as_tensor(delta)
        ax.plot(torch.linspace(0, 1, delta.numel()), delta, color=cmap(i / n), label=name if i in (0, n) else None)
    ax.set(xlabel='frequency (x pi)', ylabel='delta log amplitude', title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_eigenvalues(
        runs: Mapping[str, Sequence[float]],
        path: PathLike,
        title: str = 'Hessian max eigenvalue spectrum',
        density: Optional[Mapping[str, Any]] = None,
) -> Path:
    """Histogram of pooled top-k eigenvalues per run (how-do-vits-work Fig. 4); optional SLQ density lines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, values in runs.items():
        ax.hist(list(values), bins=30, alpha=0.5, label=label, density=True)
    for label, (grid, dens) in (density or {}).items():
        ax.plot(grid, dens, label=f'{label} (SLQ density)')
    ax.axvline(0.0, color='0.3', linewidth=0.8)
    ax.set(xlabel='eigenvalue', ylabel='density', title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_landscape_1d(runs: Mapping[str, Dict[str, torch.Tensor]], path: PathLike,
                      title: str = 'Filter-normalised loss landscape') -> Path:
    """Loss along one filter-normalised direction per run (Li et al. 2018 Fig. 1; SAM paper Fig. 1)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    for label, r in runs.items():
        ax.plot(r['alpha'], r['loss'], marker='.', label=label)
    ax.set(xlabel='alpha', ylabel='loss', title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def plot_landscape_2d(result: Dict[str, torch.Tensor], path: PathLike,
                      title: str = 'Filter-normalised loss landscape') -> Path:
    """Contours of a 2-D landscape (loss[i, j] at alpha_i, beta_j)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4.3))
    a, b = torch.meshgrid(result['alpha'], result['beta'], indexing='ij')
    cs = ax.contourf(a, b, result['loss'], levels=20, cmap='viridis')
    fig.colorbar(cs, ax=ax, label='loss')
    ax.set(xlabel='alpha', ylabel='beta', title=title)
    return _save(fig, path)


def plot_cka(result: Dict[str, Any], path: PathLike, title: str = 'Mini-batch CKA') -> Path:
    """Heatmap of a CKA matrix between reading points (how-do-vits-work Fig. 10a)."""
    plt = pyplot()
    m = result['cka']
    fig, ax = plt.subplots(figsize=(5.5, 5))
    im = ax.imshow(m, origin='lower', cmap='magma', vmin=0, vmax=1)
    fig.colorbar(im, ax=ax)
    ax.set(xlabel='layer (other)', ylabel='layer', title=title)
    return _save(fig, path)


def plot_seed_curves(
        runs: Mapping[str, Sequence[Sequence[float]]],
        path: PathLike,
        title: str,
        ylabel: str,
        xlabels: Optional[Sequence[Any]] = None,
        xlabel: str = '',
        kinds: Optional[Sequence[str]] = None,
        log: bool = False,
        every_seed: bool = False,
) -> Path:
    """``{label: [per-seed values]}``: the mean over seeds as a line, min..max over seeds as a band.

    ``every_seed`` draws each seed's own curve (thin, same colour) instead of the band, so no seed hides.
    """
    plt = pyplot()
    n = max(len(v[0]) for v in runs.values())
    fig, ax = plt.subplots(figsize=(max(6.0, 0.32 * n), 4))
    _shade(ax, kinds)
    for label, seeds in runs.items():
        values = torch.tensor([list(s) for s in seeds], dtype=torch.float64)
        x = range(values.shape[1])
        line, = ax.plot(x, values.mean(0), marker='o', markersize=3, label=f'{label} (n={values.shape[0]})')
        if every_seed:
            for row in values:
                ax.plot(x, row, color=line.get_color(), linewidth=0.7, alpha=0.45)
        else:
            ax.fill_between(x, values.min(0).values, values.max(0).values, alpha=0.2)
    if xlabels is not None:
        ax.set_xticks(range(len(xlabels)))
        ax.set_xticklabels([str(x) for x in xlabels], rotation=60 if len(xlabels) > 8 else 0,
                           ha='right' if len(xlabels) > 8 else 'center', fontsize=7 if len(xlabels) > 8 else 9)
    if log:
        ax.set_yscale('log')
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_paired_differences(
        rows: Sequence[Tuple[str, Sequence[float], float, float, float]],
        path: PathLike,
        title: str = 'Paired differences in units of each claim\'s margin',
        xlabel: str = 'difference / margin',
) -> Path:
    """One row per comparison ``(label, per-seed differences, low, high, margin)``, all divided by the margin.

    Dots are the seeds, the bar is the interval; the band [-1, 1] is "smaller than the margin", so
    comparisons in different units share one axis (linear inside the band, logarithmic beyond, so that
    a wide interval does not flatten the others). A margin of 0 draws the raw values.
    """
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.2))
    ax.axvspan(-1, 1, color='grey', alpha=0.15, lw=0)
    ax.axvline(0, color='black', lw=0.8)
    for i, (_label, diffs, low, high, margin) in enumerate(rows):
        scale = margin if margin > 0 else 1.0
        y = len(rows) - 1 - i
        ax.plot([low / scale, high / scale], [y, y], color='C0', lw=2.5)
        ax.scatter([d / scale for d in diffs], [y] * len(diffs), s=12, color='C3', zorder=3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in reversed(rows)], fontsize=7)
    ax.set_xscale('symlog', linthresh=1.0)
    ax.set(xlabel=xlabel, title=title)
    ax.grid(alpha=0.3, axis='x')
    return _save(fig, path)
