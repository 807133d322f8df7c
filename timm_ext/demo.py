"""The demo: what timm-ext's pieces bring to a small ViT on real images, trained by timm's own train.py.

scikit-learn's 1,797 real handwritten digits (:mod:`timm_ext.data`) are written once as a 16 px
ImageFolder, then timm's train.py (found and verified by :mod:`timm_ext.launch`) trains every run
with the same data, epochs, schedule and seed; only the model and the optimizer differ:

* ``vit``: timm's own ``vit_tiny_patch16_224`` with ``adamw``, the plain baseline;
* ``full``: ``vit_tiny_cb`` with ``stem='conv'`` (the Scaled-ReLU conv stem and Context Broadcasting
  in the upper half of the blocks) with ``samadamw`` (SAM around AdamW);
* the full demo adds the one-piece-off ablation: ``no_stem`` (patchify stem), ``no_cb``
  (``vit_tiny_convstem``, no CB) and ``no_sam`` (AdamW).

``--quick`` trains the first two. Every ViT is shrunk to the data with the same kwargs (16 px,
patch 4: a 4x4 grid of tokens, width 128, depth 4, 4 heads). The runs go two at a time on two
cores with one torch thread each (:mod:`timm_ext._demo_runner`), longest first. The settings were
chosen on a held-out part of the *training* images (:func:`timm_ext.data.digits_tuning_folder`),
never on the validation images (``docs/demo.md``, "Why these settings").

Each run's train.py log, checkpoint and ``summary.csv`` stay in the output folder; the demo reads the
``summary.csv`` files to make a results table, one line per piece (:mod:`timm_ext._demo_report`),
a plot and ``summary.json``.
"""
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from timm_ext._checks import positive_int, positive_number
from timm_ext._demo_report import RunResult, contributions, format_table, plot_curves, read_result

__all__ = ['DemoResult', 'DemoRun', 'RunResult', 'contributions', 'demo_runs', 'format_table', 'plot_curves',
           'run_demo']

DEFAULT_EPOCHS = 6
QUICK_EPOCHS = 4
DEMO_RHO = 0.05
IMAGE_SIZE = 16
# the ViT, shrunk to 16 px digits (the scans are 8x8): 4x4 patches of 4 px, width 128, 4 blocks of 4 heads
MODEL_KWARGS = dict(img_size=IMAGE_SIZE, patch_size=4, embed_dim=128, depth=4, num_heads=4)
STEM, CB, SAM = 'conv stem', 'CB', 'SAM'
PIECES = (STEM, CB, SAM)

# train.py settings shared by every run; chosen on a held-out part of the training digits (docs/demo.md)
TRAIN_ARGS = (
    '--num-classes', '10', '--input-size', '3', str(IMAGE_SIZE), str(IMAGE_SIZE), '--crop-pct', '1.0',
    '--mean', '0.5', '0.5', '0.5', '--std', '0.5', '0.5', '0.5', '--interpolation', 'bilinear',
    '--train-interpolation', 'bilinear', '--scale', '0.6', '1.0', '--ratio', '0.8', '1.25',
    '--hflip', '0', '--color-jitter', '0', '--smoothing', '0.1',
    '--batch-size', '16', '--validation-batch-size', '128', '--lr', '1e-3', '--weight-decay', '0.05',
    '--sched', 'cosine', '--sched-on-updates', '--warmup-epochs', '1', '--warmup-lr', '1e-5', '--min-lr', '0',
    '--workers', '0', '--log-interval', '1000', '--checkpoint-hist', '1', '--seed', '0', '--device', 'cpu',
)
# relative time of one epoch: SAM takes two forward-backward passes a step, the conv stem about a fifth more
_SAM_COST, _STEM_COST = 2.0, 1.2


@dataclass(frozen=True)
class DemoRun:
    """One train.py run of the demo: its name, its label, its model and optimizer, and the pieces it has."""
    name: str
    label: str
    model: str
    opt: str
    pieces: Tuple[str, ...]
    model_kwargs: Dict[str, Any] = field(default_factory=dict)  # on top of MODEL_KWARGS
    opt_kwargs: Dict[str, Any] = field(default_factory=dict)

    @property
    def cost(self) -> float:
        return (_SAM_COST if SAM in self.pieces else 1.0) * (_STEM_COST if STEM in self.pieces else 1.0)

    def train_args(self, data_dir: Path, output: Path, epochs: int) -> List[str]:
        """train.py's arguments: the shared TRAIN_ARGS and MODEL_KWARGS, then this run's model and optimizer."""
        args = [
            '--data-dir', str(data_dir), '--output', str(output), '--experiment', self.name,
            '--model', self.model, '--epochs', str(epochs), '--opt', self.opt, *TRAIN_ARGS,
            '--model-kwargs', *(f'{k}={v}' for k, v in dict(MODEL_KWARGS, **self.model_kwargs).items()),
        ]
        if self.opt_kwargs:
            args += ['--opt-kwargs', *(f'{k}={v}' for k, v in self.opt_kwargs.items())]
        return args


@dataclass
class DemoResult:
    output: Path
    runs: List[RunResult]
    table: str
    contributions: List[str]
    plot: Optional[Path]
    summary: Path
    wall_s: float


def demo_runs(quick: bool = False, rho: float = DEMO_RHO) -> List[DemoRun]:
    """The runs the demo compares: the plain ViT, the ViT with all three pieces, and (not quick) each piece off."""
    sam = dict(rho=rho)
    runs = [
        DemoRun('vit', 'ViT + AdamW', 'vit_tiny_patch16_224', 'adamw', ()),
        DemoRun('full', 'ViT + conv stem + CB + SAM', 'vit_tiny_cb', 'samadamw', PIECES, dict(stem='conv'), sam),
    ]
    if not quick:
        runs += [
            DemoRun('no_stem', 'ViT + CB + SAM', 'vit_tiny_cb', 'samadamw', (CB, SAM), opt_kwargs=sam),
            DemoRun('no_cb', 'ViT + conv stem + SAM', 'vit_tiny_convstem', 'samadamw', (STEM, SAM), opt_kwargs=sam),
            DemoRun('no_sam', 'ViT + conv stem + CB', 'vit_tiny_cb', 'adamw', (STEM, CB), dict(stem='conv')),
        ]
    return runs


def _count_images(folder: Path) -> int:
    return sum(1 for p in folder.rglob('*') if p.suffix.lower() in ('.png', '.jpg', '.jpeg'))


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
        rho: float = DEMO_RHO,
        timm_train: Optional[str] = None,
        data_root: Optional[os.PathLike] = None,
        progress: bool = True,
        jobs: Optional[int] = None,
        log: Callable[[str], None] = print,
) -> DemoResult:
    """Train the demo's runs through timm's train.py, ``jobs`` at a time, and write the table, plot and summary.

    ``log`` receives the lines printed before training (where the data and the outputs are, how the
    runs share the cores) and, without ``progress``, one line per finished run.
    """
    from timm_ext._demo_runner import Job, available_cores, plan_parallelism, run_jobs
    from timm_ext.data import digits_image_folder
    from timm_ext.launch.commands import build_train_command, child_env

    if epochs is None:
        epochs = QUICK_EPOCHS if quick else DEFAULT_EPOCHS
    positive_int('--epochs', epochs)
    if jobs is not None:
        positive_int('--jobs', jobs)
    positive_number('--rho', rho)
    runs = demo_runs(quick, rho)
    cores = available_cores()
    lanes, threads = plan_parallelism(len(runs), cores, jobs)
    out = _choose_output_dir(output)
    data_dir = digits_image_folder(data_root, size=IMAGE_SIZE)
    train_images, val_images = _count_images(data_dir / 'train'), _count_images(data_dir / 'validation')
    first = build_train_command(runs[0].train_args(data_dir, out, epochs), timm_train=timm_train)
    commands = [first.argv] + [  # every problem (script, arguments) is found before anything is written or trained
        build_train_command(run.train_args(data_dir, out, epochs), script=first.script).argv for run in runs[1:]]
    out.mkdir(parents=True, exist_ok=True)
    env = dict(child_env(), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    log(f'data:    {data_dir} ({train_images} training, {val_images} validation images, {IMAGE_SIZE} px)')
    log(f'output:  {out}')
    names = ', '.join(r.name for r in runs)
    log(f'runs:    {len(runs)} train.py runs of {epochs} epoch{"s" if epochs > 1 else ""} ({names}), {lanes} at a '
        f'time with {threads} torch thread{"s" if threads > 1 else ""} each on {cores} CPU core'
        f'{"s" if cores > 1 else ""}; logs: {out}{os.sep}<run>.log')

    by_name = {r.name: r for r in runs}
    todo = [Job(r.name, cmd, out / f'{r.name}.log', out / r.name / 'summary.csv', epochs, r.cost)
            for r, cmd in zip(runs, commands)]
    from tqdm.auto import tqdm
    start = time.perf_counter()
    reported = set()
    with tqdm(total=sum(j.epochs for j in todo), disable=not progress, desc='timm-ext demo',
              bar_format='{desc}: {percentage:3.0f}%|{bar}| {n}/{total} epochs [{elapsed}{postfix}]') as bar:
        def on_update(state, now):
            bar.n = state.done_epochs
            bar.set_postfix_str(state.postfix(now))
            for name in sorted(set(state.finished) - reported):
                reported.add(name)
                if not progress:
                    log(f'{name}: done in {state.finished[name] - state.started[name]:.0f} s')
        done = run_jobs(todo, env, lanes, on_update)
    wall = time.perf_counter() - start
    results = [read_result(r.name, r.label, r.pieces, out / r.name, done.wall_s(r.name), train_images,
                           done.cpu_s.get(r.name)) for r in runs]

    table = format_table(results)
    lines = contributions(results, val_images)
    plot = None
    try:
        plot = plot_curves(results, out / 'curves.png')
    except ImportError:
        pass
    summary = out / 'summary.json'
    summary.write_text(json.dumps(dict(
        data=str(data_dir), train_images=train_images, validation_images=val_images, epochs=epochs,
        model_kwargs=MODEL_KWARGS, train_args=list(TRAIN_ARGS), cores=cores, jobs=lanes, threads_per_run=threads,
        wall_s=wall, runs=[dict(r.as_dict(), model=by_name[r.name].model, opt=by_name[r.name].opt,
                               argv=list(cmd)) for r, cmd in zip(results, commands)],
        table=table, contributions=lines, plot=str(plot) if plot else None), indent=2))
    return DemoResult(output=out, runs=results, table=table, contributions=lines, plot=plot, summary=summary,
                      wall_s=wall)
