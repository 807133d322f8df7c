"""The demo: what timm-ext's pieces bring to a small ViT on real images, trained by timm's own train.py.

scikit-learn's 1,797 real handwritten digits (:mod:`timm_ext.data`) are written once as a 16 px
ImageFolder, then timm's train.py (found and verified by :mod:`timm_ext.launch`) trains every run
with the same data, epochs, schedule and seed; only the model and the optimizer differ
(:mod:`timm_ext.demo.runs`). Where train.py is not on the machine and cannot be downloaded (timm's
wheel has none), the demo says so in one line and trains the same runs in its own loop of timm's
installed parts, which gives the same top-1 (:mod:`timm_ext.demo.routes`, :mod:`timm_ext.demo.builtin_loop`):

* ``vit``: timm's own ``vit_tiny_patch16_224`` with ``adamw``, the plain baseline;
* ``full``: ``vit_tiny_cb`` with ``stem='conv'`` (the Scaled-ReLU conv stem and Context Broadcasting
  in the upper half of the blocks) with ``samadamw`` (SAM around AdamW);
* the full demo adds the one-piece-off ablation: ``no_stem`` (patchify stem), ``no_cb``
  (``vit_tiny_convstem``, no CB) and ``no_sam`` (AdamW).

``--quick`` trains the first two. Every ViT is shrunk to the data with the same kwargs (16 px,
patch 4: a 4x4 grid of tokens, width 128, depth 4, 4 heads). The runs go two at a time on two
cores with one torch thread each, longest first (:mod:`timm_ext.demo.runner`, the runner the
reproduction study and the SAM-variant table use too). The settings were chosen on a held-out part
of the *training* images (:func:`timm_ext.data.digits_tuning_folder`), never on the validation
images (``docs/demo.md``, "Why these settings").

Each run's log, checkpoints and ``summary.csv`` (train.py's, or the built-in loop's in train.py's format) stay
in the output folder; the demo reads the ``summary.csv`` files to make a results table, one line per piece
(:mod:`timm_ext.demo.report`), a plot and ``summary.json``. This module is the entry point ``timm-ext demo``
calls: :func:`run_demo`.
"""
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

from timm_ext.arg_types import positive_int, positive_number
from timm_ext.demo.report import RunResult, contributions, format_table, plot_curves, read_result
from timm_ext.demo.runs import (
    DEFAULT_EPOCHS,
    DEMO_RHO,
    IMAGE_SIZE,
    MODEL_KWARGS,
    QUICK_EPOCHS,
    TRAIN_ARGS,
    DemoRun,
    demo_runs,
)

__all__ = ['DEFAULT_EPOCHS', 'DEMO_RHO', 'IMAGE_SIZE', 'MODEL_KWARGS', 'QUICK_EPOCHS', 'TRAIN_ARGS', 'DemoResult',
           'DemoRun', 'RunResult', 'contributions', 'demo_runs', 'format_table', 'plot_curves', 'run_demo']


@dataclass
class DemoResult:
    """What :func:`run_demo` made: the output folder, each run's result, the table, the lines per piece, the files."""
    output: Path
    runs: List[RunResult]
    table: str
    contributions: List[str]
    plot: Optional[Path]
    summary: Path
    wall_s: float


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
    """Train the demo's runs through timm's train.py (or, where it cannot be had, the built-in loop), ``jobs`` at
    a time, and write the table, plot and summary.

    ``log`` receives the lines printed before training (the built-in loop's one line when it is used, where the
    data and the outputs are, how the runs share the cores) and, without ``progress``, one line per finished run.
    """
    from timm_ext.data import digits_image_folder
    from timm_ext.demo.routes import demo_jobs
    from timm_ext.demo.runner import available_cores, plan_parallelism, run_jobs, thread_env

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
    # every problem (script, arguments) is found before anything is written or trained
    todo, builtin = demo_jobs([r.training(data_dir, epochs) for r in runs], out, timm_train)
    out.mkdir(parents=True, exist_ok=True)
    if builtin:
        log(f'timm-ext demo: {builtin}')
    log(f'data:    {data_dir} ({train_images} training, {val_images} validation images, {IMAGE_SIZE} px)')
    log(f'output:  {out}')
    names = ', '.join(r.name for r in runs)
    what = 'built-in loop' if builtin else 'train.py'
    log(f'runs:    {len(runs)} {what} runs of {epochs} epoch{"s" if epochs > 1 else ""} ({names}), {lanes} at a '
        f'time with {threads} torch thread{"s" if threads > 1 else ""} each on {cores} CPU core'
        f'{"s" if cores > 1 else ""}; logs: {out}{os.sep}<run>.log')

    by_name = {r.name: r for r in runs}
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
        done = run_jobs(todo, thread_env(threads), lanes, on_update, label='demo run')
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
        route=what, data=str(data_dir), train_images=train_images, validation_images=val_images, epochs=epochs,
        model_kwargs=MODEL_KWARGS, train_args=list(TRAIN_ARGS), cores=cores, jobs=lanes, threads_per_run=threads,
        wall_s=wall, runs=[dict(r.as_dict(), model=by_name[r.name].model, opt=by_name[r.name].opt,
                               argv=list(job.argv)) for r, job in zip(results, todo)],
        table=table, contributions=lines, plot=str(plot) if plot else None), indent=2))
    return DemoResult(output=out, runs=results, table=table, contributions=lines, plot=plot, summary=summary,
                      wall_s=wall)
