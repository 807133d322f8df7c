"""The demo's results: per-run numbers read back from train.py, the table, one line per piece, the plot."""
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from timm_ext._summary_csv import read_summary

__all__ = ['NOISE_POINTS', 'RunResult', 'contributions', 'format_table', 'plot_curves', 'read_result']

# One seed per run. Held out (docs/demo.md), 3 seeds of 6 epochs gave standard deviations of 1.2 points (conv stem +
# CB + SAM) and 3.2 points (plain ViT): a gap below this many points is reported as noise, not a gain or a loss.
NOISE_POINTS = 3.0


@dataclass
class RunResult:
    """What one run measured, read back from train.py's summary.csv."""
    name: str
    label: str
    pieces: List[str]
    epochs: List[int]
    train_loss: List[float]
    eval_loss: List[float]
    eval_top1: List[float]
    wall_s: float
    train_images: int
    folder: str
    cpu_s: Optional[float] = None  # user + system time of the train.py process, where the OS reports it

    @property
    def top1(self) -> float:
        return self.eval_top1[-1]

    @property
    def best_top1(self) -> float:
        return max(self.eval_top1)

    @property
    def images_per_s(self) -> float:
        """Training images per second of wall time, the run's evaluation and start-up included."""
        return self.train_images * len(self.epochs) / self.wall_s

    def as_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out.update(top1=self.top1, best_top1=self.best_top1, images_per_s=self.images_per_s)
        return out


def format_table(runs: Sequence[RunResult]) -> str:
    """A Markdown table: final and best top-1, final losses, wall time and throughput per run."""
    head = '| run | epochs | top-1 (last) | top-1 (best) | train loss | val loss | wall time | img/s |'
    rows = [head, '|---|---|---|---|---|---|---|---|']
    for r in runs:
        rows.append(
            f'| {r.label} | {len(r.epochs)} | {r.top1:.1f} % | {r.best_top1:.1f} % | {r.train_loss[-1]:.3f} | '
            f'{r.eval_loss[-1]:.3f} | {r.wall_s:.0f} s | {r.images_per_s:.0f} |')
    return '\n'.join(rows)


def _verdict(gap: float) -> str:
    if abs(gap) < NOISE_POINTS:
        return f'within the noise of one seed (under {NOISE_POINTS:g} points)'
    return 'helps here' if gap > 0 else 'costs accuracy here'


def _line(what: str, gap: float, with_: RunResult, without: RunResult, val_images: int) -> str:
    images = round(abs(gap) / 100 * val_images)
    return (f'{what}: {gap:+.1f} points ({with_.label} {with_.top1:.1f} % vs {without.label} {without.top1:.1f} %, '
            f'{images} of {val_images} validation images), {_verdict(gap)}; wall time {with_.wall_s:.0f} s vs '
            f'{without.wall_s:.0f} s')


def contributions(runs: Sequence[RunResult], val_images: int) -> List[str]:
    """One line per comparison the runs allow: all pieces against the plain ViT, then each piece left out.

    A piece's contribution is the full run's last-epoch top-1 minus that of the run without the piece
    (same data, epochs, schedule and seed). One seed each: small gaps are called noise (``NOISE_POINTS``).
    """
    by_pieces = {frozenset(r.pieces): r for r in runs}
    full = max(runs, key=lambda r: len(r.pieces))
    everything = frozenset(full.pieces)
    lines = []
    plain = by_pieces.get(frozenset())
    if plain is not None and plain is not full:
        lines.append(_line(' + '.join(full.pieces) + ' together', full.top1 - plain.top1, full, plain, val_images))
    for piece in full.pieces:
        without = by_pieces.get(everything - {piece})
        if without is not None:
            lines.append(_line(piece, full.top1 - without.top1, full, without, val_images))
    return lines


def plot_curves(runs: Sequence[RunResult], path: Path) -> Path:
    """Validation top-1 and train loss per epoch, one line per run (matplotlib, Agg backend)."""
    import matplotlib
    matplotlib.use('Agg', force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_top1, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.5))
    for r in runs:
        ax_top1.plot(r.epochs, r.eval_top1, marker='o', label=r.label)
        ax_loss.plot(r.epochs, r.train_loss, marker='o', label=r.label)
    ax_top1.axhline(10.0, color='grey', linestyle=':', label='chance (10 classes)')
    ax_top1.set(xlabel='epoch', ylabel='validation top-1 (%)', title='Digits, validation top-1', ylim=(0, 100))
    ax_loss.set(xlabel='epoch', ylabel='train loss', title='Digits, train loss')
    for ax in (ax_top1, ax_loss):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize='small')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def read_result(name: str, label: str, pieces: Sequence[str], run_dir: Path, wall_s: float,
                train_images: int, cpu_s: Optional[float] = None) -> RunResult:
    """A run's :class:`RunResult` from its ``summary.csv``; raises RuntimeError when train.py wrote no epoch."""
    rows = read_summary(run_dir / 'summary.csv')
    if not rows:
        raise RuntimeError(f'train.py wrote no epochs to {run_dir / "summary.csv"} for the demo run {name!r}')
    return RunResult(
        name=name, label=label, pieces=list(pieces), epochs=[int(r['epoch']) + 1 for r in rows],
        train_loss=[r['train_loss'] for r in rows], eval_loss=[r['eval_loss'] for r in rows],
        eval_top1=[r['eval_top1'] for r in rows], wall_s=wall_s, train_images=train_images, folder=str(run_dir),
        cpu_s=cpu_s)
