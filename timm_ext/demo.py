"""The demo: Context Broadcasting + SAM against a plain ViT + AdamW, on real images, through timm's train.py.

What it shows is the pipeline end to end, not a paper result: scikit-learn's 1,797 real handwritten
digits (:mod:`timm_ext.data`) are written once as an ImageFolder, then timm's own train.py (found
and verified by :mod:`timm_ext.training`) trains two runs with the same budget and the same data:

* ``cb_sam``: ``vit_tiny_cb`` (Context Broadcasting in the upper half of the blocks) with ``samadamw``;
* ``baseline``: timm's ``vit_tiny_patch16_224`` (no CB) with ``adamw``.

Both are shrunk to the data (32 px, patch 4, width 128, depth 4, 4 heads). The settings were
measured on this data through train.py on 2 CPU cores (``docs/demo.md``): a ViT-Ti (width 192,
depth 6) at batch 64 stays near chance for several epochs and reaches about 50 % after 8; this
smaller ViT at batch 16 (89 steps an epoch) passes 80 % top-1 within 10 epochs with AdamW. SAM uses
rho 0.05, the SAM paper's default radius; at this scale it starts learning about an epoch later than
AdamW and catches up (rho 0.02 tracks AdamW from the start).

Each run's train.py log, checkpoint and ``summary.csv`` stay in the output folder; the demo reads the
``summary.csv`` files to make a results table, a plot (validation top-1 and train loss per epoch)
and ``summary.json``.
"""
import csv
import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

__all__ = ['DemoRun', 'DemoResult', 'RunResult', 'demo_runs', 'format_table', 'plot_curves', 'run_demo']

DEFAULT_EPOCHS = 10
QUICK_EPOCHS = 2
DEFAULT_MODEL = 'vit_tiny_cb'
DEFAULT_BASELINE = 'vit_tiny_patch16_224'
DEMO_RHO = 0.05
# the ViT, shrunk to 32 px digits: 8x8 patches of 4 px, width 128, 4 blocks of 4 heads
MODEL_KWARGS = dict(img_size=32, patch_size=4, embed_dim=128, depth=4, num_heads=4)

# train.py settings shared by both runs; chosen for 1,438 training digits of 32 px on a CPU (docs/demo.md)
TRAIN_ARGS = (
    '--num-classes', '10', '--input-size', '3', '32', '32', '--crop-pct', '1.0',
    '--mean', '0.5', '0.5', '0.5', '--std', '0.5', '0.5', '0.5', '--interpolation', 'bilinear',
    '--train-interpolation', 'bilinear', '--scale', '0.6', '1.0', '--ratio', '0.8', '1.25',
    '--hflip', '0', '--color-jitter', '0', '--smoothing', '0.1',
    '--batch-size', '16', '--validation-batch-size', '128', '--lr', '1e-3', '--weight-decay', '0.05',
    '--sched', 'cosine', '--sched-on-updates', '--warmup-epochs', '1', '--warmup-lr', '1e-5', '--min-lr', '0',
    '--workers', '1', '--log-interval', '1000', '--checkpoint-hist', '1', '--seed', '0', '--device', 'cpu',
)


@dataclass
class DemoRun:
    """One train.py run of the demo: a name, a label for tables and plots, and its arguments."""
    name: str
    label: str
    model: str
    opt: str
    opt_kwargs: Dict[str, Any] = field(default_factory=dict)

    def train_args(self, data_dir: Path, output: Path, epochs: int, model_kwargs: Dict[str, Any]) -> List[str]:
        args = [
            '--data-dir', str(data_dir), '--output', str(output), '--experiment', self.name,
            '--model', self.model, '--epochs', str(epochs), '--opt', self.opt, *TRAIN_ARGS,
            '--model-kwargs', *(f'{k}={v}' for k, v in model_kwargs.items()),
        ]
        if self.opt_kwargs:
            args += ['--opt-kwargs', *(f'{k}={v}' for k, v in self.opt_kwargs.items())]
        return args


@dataclass
class RunResult:
    """What one run measured, read back from train.py's summary.csv."""
    name: str
    label: str
    epochs: List[int]
    train_loss: List[float]
    eval_loss: List[float]
    eval_top1: List[float]
    wall_s: float
    train_images: int
    folder: str

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


@dataclass
class DemoResult:
    output: Path
    runs: List[RunResult]
    table: str
    plot: Optional[Path]
    summary: Path


def demo_runs(model: str = DEFAULT_MODEL, baseline: str = DEFAULT_BASELINE, rho: float = DEMO_RHO) -> List[DemoRun]:
    """The two runs the demo compares."""
    return [
        DemoRun('cb_sam', f'{model} + SAM (rho {rho:g})', model, 'samadamw', dict(rho=rho)),
        DemoRun('baseline', f'{baseline} + AdamW', baseline, 'adamw'),
    ]


def _read_summary(path: Path) -> List[Dict[str, float]]:
    try:
        with open(path, newline='') as f:
            return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    except (OSError, ValueError):
        return []


def _log_tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors='replace').strip().splitlines()
    except OSError:
        return ''
    return '\n'.join(text[-lines:])


def _count_images(folder: Path) -> int:
    return sum(1 for p in folder.rglob('*') if p.suffix.lower() in ('.png', '.jpg', '.jpeg'))


def _run_one(
        run: DemoRun,
        cmd: Sequence[str],
        env: Dict[str, str],
        run_dir: Path,
        log_path: Path,
        on_epoch: Callable[[int], None],
        poll_s: float = 0.5,
) -> float:
    """Run train.py for ``run``, its output to ``log_path``; calls ``on_epoch`` per epoch in ``run_dir/summary.csv``."""
    summary = run_dir / 'summary.csv'
    done = 0
    start = time.perf_counter()
    with open(log_path, 'w') as log:
        child = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            while True:
                code = child.poll()
                rows = len(_read_summary(summary))
                if rows > done:
                    on_epoch(rows - done)
                    done = rows
                if code is not None:
                    break
                time.sleep(poll_s)
        except BaseException:
            child.terminate()
            child.wait()
            raise
    wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(
            f'train.py failed for the demo run {run.name!r} (exit code {code}); its log is {log_path}:\n'
            f'{_log_tail(log_path)}')
    return wall


def _result(run: DemoRun, run_dir: Path, wall: float, train_images: int) -> RunResult:
    rows = _read_summary(run_dir / 'summary.csv')
    if not rows:
        raise RuntimeError(f'train.py wrote no epochs to {run_dir / "summary.csv"} for the demo run {run.name!r}')
    return RunResult(
        name=run.name, label=run.label, epochs=[int(r['epoch']) + 1 for r in rows],
        train_loss=[r['train_loss'] for r in rows], eval_loss=[r['eval_loss'] for r in rows],
        eval_top1=[r['eval_top1'] for r in rows], wall_s=wall, train_images=train_images, folder=str(run_dir))


def format_table(runs: Sequence[RunResult]) -> str:
    """A Markdown table: final and best top-1, final losses, wall time and throughput per run."""
    head = '| run | epochs | top-1 (last) | top-1 (best) | train loss | val loss | wall time | img/s |'
    rows = [head, '|---|---|---|---|---|---|---|---|']
    for r in runs:
        rows.append(
            f'| {r.label} | {len(r.epochs)} | {r.top1:.1f} % | {r.best_top1:.1f} % | {r.train_loss[-1]:.3f} | '
            f'{r.eval_loss[-1]:.3f} | {r.wall_s:.0f} s | {r.images_per_s:.0f} |')
    return '\n'.join(rows)


def plot_curves(runs: Sequence[RunResult], path: Path) -> Path:
    """Validation top-1 and train loss per epoch, one line per run (matplotlib, Agg backend)."""
    import matplotlib
    matplotlib.use('Agg', force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_top1, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
    for r in runs:
        ax_top1.plot(r.epochs, r.eval_top1, marker='o', label=r.label)
        ax_loss.plot(r.epochs, r.train_loss, marker='o', label=r.label)
    ax_top1.axhline(10.0, color='grey', linestyle=':', label='chance (10 classes)')
    ax_top1.set(xlabel='epoch', ylabel='validation top-1 (%)', title='Digits, validation top-1', ylim=(0, 100))
    ax_loss.set(xlabel='epoch', ylabel='train loss', title='Digits, train loss')
    for ax in (ax_top1, ax_loss):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _choose_output_dir(output: Optional[os.PathLike]) -> Path:
    """The demo's folder; an existing non-empty folder is never written into (nothing is overwritten)."""
    if output is None:
        base = Path('timm-ext-demo')
        output = base / time.strftime('%Y%m%d-%H%M%S')
        suffix = 1
        while output.exists():
            suffix += 1
            output = base / f'{time.strftime("%Y%m%d-%H%M%S")}-{suffix}'
    output = Path(output).expanduser()
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise FileExistsError(f'--output {output} exists and is not an empty folder; the demo never writes over '
                              f'earlier results: name a new folder')
    return output


def run_demo(
        output: Optional[os.PathLike] = None,
        epochs: Optional[int] = None,
        quick: bool = False,
        model: str = DEFAULT_MODEL,
        baseline: str = DEFAULT_BASELINE,
        rho: float = DEMO_RHO,
        timm_train: Optional[str] = None,
        data_root: Optional[os.PathLike] = None,
        progress: bool = True,
) -> DemoResult:
    """Train the demo's two runs through timm's train.py and write the table, plot and JSON summary."""
    from timm_ext.data import digits_image_folder
    from timm_ext.training import build_train_command, child_env

    if epochs is None:
        epochs = QUICK_EPOCHS if quick else DEFAULT_EPOCHS
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise ValueError(f'--epochs must be a positive integer, got {epochs!r}')
    if not rho > 0:
        raise ValueError(f'--rho must be > 0, got {rho!r}')
    runs = demo_runs(model, baseline, rho)
    data_dir = digits_image_folder(data_root)
    train_images = _count_images(data_dir / 'train')
    out = _choose_output_dir(output)
    commands = [  # every problem (script, arguments) is found before anything is written or trained
        build_train_command(run.train_args(data_dir, out, epochs, MODEL_KWARGS), timm_train=timm_train).argv
        for run in runs]
    out.mkdir(parents=True, exist_ok=True)
    env = child_env()

    from tqdm.auto import tqdm
    results = []
    with tqdm(total=epochs * len(runs), unit='epoch', disable=not progress, desc='timm-ext demo') as bar:
        for run, cmd in zip(runs, commands):
            run_dir = out / run.name  # train.py creates it (--output out --experiment run.name)
            bar.set_postfix_str(run.name)
            wall = _run_one(run, cmd, env, run_dir, out / f'{run.name}.log', bar.update)
            results.append(_result(run, run_dir, wall, train_images))

    table = format_table(results)
    plot = None
    try:
        plot = plot_curves(results, out / 'curves.png')
    except ImportError:
        pass
    summary = out / 'summary.json'
    summary.write_text(json.dumps(dict(
        data=str(data_dir), train_images=train_images, epochs=epochs, model_kwargs=MODEL_KWARGS,
        train_args=list(TRAIN_ARGS), runs=[r.as_dict() for r in results], table=table,
        plot=str(plot) if plot else None), indent=2))
    return DemoResult(output=out, runs=results, table=table, plot=plot, summary=summary)
