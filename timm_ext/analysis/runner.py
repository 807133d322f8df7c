"""One metric on one model and a data folder, written as JSON, CSV and a plot: what ``timm-ext analyze`` runs.

* :func:`build_model`: ``timm.create_model`` with a train.py checkpoint's recorded model arguments (from
  :mod:`timm_ext.hub`, read with ``weights_only=True``), overridden by ``model_kwargs``, then its weights;
* :func:`load_batches`: ``N`` seeded-shuffled batches of an ImageFolder (``digits``: the embedded
  scikit-learn digits of :mod:`timm_ext.data`, 32 px, normalised as the demo trains them) through timm's
  eval transform;
* :func:`run_metric`: the measurement, ``<out>/<metric>.json``, ``<out>/<metric>.csv``, ``<out>/<metric>.png``.
"""
import csv
import inspect
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from timm_ext.arg_types import positive_int

__all__ = [
    'METRICS', 'LOSS_METRICS', 'METRIC_OPTIONS', 'MetricResult', 'build_model', 'load_batches', 'metric_options',
    'option_default', 'parse_kwargs', 'progress_total', 'run_metric',
]

# metric -> what it measures (the CLI's help lists these)
METRICS: Dict[str, str] = {
    'attention': 'attention entropy (nats) and mean distance per layer and head (CB paper Fig. 4, 7)',
    'tokens': 'mean pairwise cosine similarity of patch tokens per layer (scaled-ReLU paper Eq. 5, Fig. 1)',
    'hessian': 'top-k Hessian eigenvalues of every batch, NEP, APE and lambda_max (how-do-vits-work Fig. 4)',
    'trace': 'Hessian trace by Hutchinson\'s estimator',
    'density': 'Hessian eigenvalue density by stochastic Lanczos quadrature',
    'noise': 'L_train^N: the loss under Gaussian weight noise (SAM paper Table 1)',
    'fourier': 'delta log amplitude of feature maps per block (how-do-vits-work Fig. 2, 8)',
    'variance': 'feature-map variance per block (how-do-vits-work Fig. 9)',
    'landscape': 'filter-normalised 1-D loss landscape (Li et al. 2018)',
    'landscape2d': 'filter-normalised 2-D loss landscape (Li et al. 2018; SAM paper Fig. 1)',
    'cka': 'mini-batch linear CKA between layers (how-do-vits-work Fig. 10a)',
    'lesion': 'top-1 with each MSA/MLP/block removed (how-do-vits-work Fig. 10b)',
    'activity': 'fraction of active GELU/ReLU neurons per layer (SAM paper Fig. 2)',
}
# the options run_metric passes on to the library functions (their keyword names)
METRIC_OPTIONS = ('k', 'max_iter', 'weight_decay', 'samples', 'runs', 'iterations', 'sigma', 'steps', 'span', 'seed')
# measured on the training split by default, as the papers do; the others on the validation split
LOSS_METRICS = ('hessian', 'trace', 'density', 'noise', 'landscape', 'landscape2d')

DIGITS_INPUT = dict(input_size=(3, 32, 32), interpolation='bilinear', crop_pct=1.0, mean=(0.5,) * 3, std=(0.5,) * 3)


def parse_kwargs(items: Sequence[str]) -> Dict[str, Any]:
    """``['k=v', ...]`` as train.py's ``--model-kwargs`` reads them (Python literals, else strings)."""
    import ast

    out: Dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition('=')
        if not sep or not key.isidentifier():
            raise ValueError(f'--model-kwargs takes KEY=VALUE pairs, got {item!r}')
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def build_model(
        name: Optional[str],
        checkpoint: Optional[os.PathLike] = None,
        model_kwargs: Optional[Dict[str, Any]] = None,
        num_classes: Optional[int] = None,
) -> nn.Module:
    """The model to analyse, in eval mode, with the checkpoint's weights (strict) when one is given."""
    import timm

    import timm_ext.models  # noqa: F401 (registers the timm-ext architectures)

    kwargs: Dict[str, Any] = {}
    ckpt = None
    if checkpoint is not None:
        from timm_ext.hub import load_checkpoint
        ckpt = load_checkpoint(checkpoint)
        kwargs.update(ckpt.model_kwargs())
        name = name or ckpt.arch
    if not name:
        raise ValueError('name a model with --model (the checkpoint does not record its architecture)')
    if num_classes is not None:
        kwargs.setdefault('num_classes', num_classes)
    kwargs.update(model_kwargs or {})
    if not timm.is_model(name):
        raise ValueError(f'unknown model {name!r}: see `timm-ext models` or timm.list_models()')
    model = timm.create_model(name, **kwargs)
    if ckpt is not None:
        from timm_ext.hub import load_weights
        load_weights(model, ckpt.state_dict, ckpt.path)
    return model.eval()


def _data_root(data: str, split: str) -> Tuple[Path, bool]:
    if data == 'digits':
        from timm_ext.data import digits_image_folder
        return digits_image_folder() / split, True
    root = Path(data).expanduser()
    if not root.is_dir():
        raise ValueError(f'--data must be "digits" or an ImageFolder directory, got {data!r} (not a directory)')
    return (root / split if (root / split).is_dir() else root), False


def load_batches(
        data: str,
        split: str,
        batch_size: int,
        batches: int,
        model: Optional[nn.Module] = None,
        seed: int = 0,
        img_size: Optional[int] = None,
        data_config: Optional[Dict[str, Any]] = None,
) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """``batches`` batches of ``batch_size`` images and labels from ``data`` ('digits' or a folder), seeded.

    A folder's images get timm's eval transform for ``model`` at ``img_size`` (default: the size of the
    model's patch embedding, else its pretrained config's). ``data_config`` (a train.py run's preprocessing:
    ``input_size``, ``mean``, ``std``, ``interpolation``, ``crop_pct``, ``crop_mode``) replaces those values.
    """
    from timm.data import ImageDataset, create_transform, resolve_data_config

    positive_int('--batch-size', batch_size)
    positive_int('--batches', batches)
    root, digits = _data_root(data, split)
    config = dict(DIGITS_INPUT) if digits else resolve_data_config({}, model=model)
    config.update(data_config or {})
    size = img_size or (None if 'input_size' in (data_config or {}) else _model_img_size(model))
    if size is not None:
        config['input_size'] = (3, *size) if isinstance(size, tuple) else (3, size, size)
    dataset = ImageDataset(str(root), transform=create_transform(**config, is_training=False))
    if len(dataset) == 0:
        raise ValueError(f'no images found under {root}')
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    out = []
    for b in range(batches):
        idx = order[b * batch_size:(b + 1) * batch_size]
        if not idx:
            break
        items = [dataset[i] for i in idx]
        out.append((torch.stack([x for x, _ in items]), torch.tensor([int(y) for _, y in items])))
    return out


def _tuned_function(metric: str) -> Optional[Callable]:
    """The library function whose keyword arguments are ``metric``'s options (None: it takes none)."""
    from timm_ext import analysis as A

    return {'hessian': A.hessian_max_eigenvalue_spectrum, 'trace': A.hessian_trace,
            'density': A.hessian_spectrum_density, 'noise': A.noisy_loss, 'landscape': A.loss_landscape_1d,
            'landscape2d': A.loss_landscape_2d}.get(metric)


def option_default(metric: str, option: str) -> Any:
    """The default of ``option`` for ``metric``: the library function's own (the CLI help shows it)."""
    fn = _tuned_function(metric)
    if fn is None or option not in METRIC_OPTIONS or option not in inspect.signature(fn).parameters:
        raise ValueError(f'{metric} takes no option {option!r}')
    return inspect.signature(fn).parameters[option].default


def metric_options(metric: str, options: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The entries of ``options`` that ``metric``'s library function takes; the others are for other metrics.

    ``samples`` counts Hutchinson probes (trace) or noise draws (noise); density's Lanczos runs are ``runs``.
    """
    options = dict(options or {})
    unknown = sorted(set(options) - set(METRIC_OPTIONS))
    if unknown:
        raise ValueError(f'unknown analysis option {unknown[0]!r}: choose from {", ".join(METRIC_OPTIONS)}')
    if metric == 'density' and 'samples' in options:
        raise ValueError('density counts Lanczos runs with runs= (--runs), not samples=')
    fn = _tuned_function(metric)
    accepted = inspect.signature(fn).parameters if fn is not None else {}
    return {k: v for k, v in options.items() if k in accepted}


def progress_total(metric: str, num_batches: int, options: Optional[Dict[str, Any]] = None) -> int:
    """How many times :func:`run_metric` calls ``progress(1)`` for ``metric``: a progress bar's total."""
    if metric in ('landscape', 'landscape2d'):
        steps = int(metric_options(metric, options).get('steps', option_default(metric, 'steps')))
        return steps if metric == 'landscape' else steps ** 2
    if metric in ('trace', 'density', 'noise'):
        return 1
    if metric == 'lesion':
        return 0  # one tick per unit; the number of units is known once the model is probed
    return num_batches


def _model_img_size(model: Optional[nn.Module]) -> Optional[Tuple[int, int]]:
    size = getattr(getattr(model, 'patch_embed', None), 'img_size', None)
    return tuple(size) if isinstance(size, (tuple, list)) and len(size) == 2 else None


@dataclass
class MetricResult:
    """What :func:`run_metric` measured and where it wrote it."""
    metric: str
    summary: Dict[str, Any]
    json: Path
    csv: Path
    plot: Optional[Path]


def _jsonable(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> Path:
    with open(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _kinds(model: nn.Module, names: Sequence[str]) -> List[str]:
    from timm_ext.analysis._hooks import feature_points
    try:
        points = feature_points(model)
    except ValueError:
        return []
    return [points[n].kind if n in points else '' for n in names]


@dataclass
class _Job:
    """What one metric function gets: the model, data, options, output folder and progress callback."""
    model: nn.Module
    batches: List[Tuple[torch.Tensor, torch.Tensor]]
    options: Dict[str, Any]
    out: Path
    tick: Callable[[int], None]
    other: Optional[nn.Module]
    plot: bool

    @property
    def label(self) -> str:
        return getattr(self.model, 'pretrained_cfg', {}).get('architecture') or type(self.model).__name__

    @property
    def images(self):
        return _ticking([x for x, _ in self.batches], self.tick)

    def call(self, fn: Callable, *args: Any, **fixed: Any) -> Any:
        """``fn(*args, **options, **fixed)`` with the options ``fn`` takes; the rest keep ``fn``'s defaults."""
        accepted = inspect.signature(fn).parameters
        return fn(*args, **{k: v for k, v in self.options.items() if k in accepted}, **fixed)

    @property
    def weight_decay(self) -> float:
        """The weight decay the loss metrics add (0 unless given), for their JSON."""
        return self.options.get('weight_decay', 0.0)


# each metric: (job) -> (summary for the JSON, CSV header, CSV rows, plot path or None)
Measured = Tuple[Dict[str, Any], List[str], List[List[Any]], Optional[Path]]


def _attention(job: _Job) -> Measured:
    from timm_ext.analysis import attention_stats
    from timm_ext.analysis.plots import plot_layer_heads

    stats = attention_stats(job.model, job.images)
    ent, dist = stats['entropy'], stats['distance']
    rows = [[i, h, float(ent[i, h]), float(dist[i, h])] for i in range(ent.shape[0]) for h in range(ent.shape[1])]
    drawn = None
    if job.plot:
        drawn = plot_layer_heads({job.label: ent}, job.out / 'attention.png', 'Attention entropy', 'entropy (nats)',
                                 bound=float(stats['max_entropy'][0]))
        plot_layer_heads({job.label: dist}, job.out / 'attention_distance.png', 'Attention distance',
                         'mean distance (grid side = 1)')
    return dict(stats), ['layer', 'head', 'entropy', 'distance'], rows, drawn


def _per_layer(metric: str) -> Callable[[_Job], Measured]:
    def measure(job: _Job) -> Measured:
        from timm_ext import analysis as A
        from timm_ext.analysis.plots import plot_per_layer

        fn = {'tokens': A.token_cosine_similarity, 'variance': A.feature_variance_per_block,
              'activity': A.active_neuron_fraction}[metric]
        values = fn(job.model, job.images)
        drawn = plot_per_layer({job.label: values}, job.out / f'{metric}.png', METRICS[metric].split(' (')[0],
                               metric, kinds=_kinds(job.model, list(values)), log=metric == 'variance') \
            if job.plot else None
        return dict(values=values), ['layer', metric], [[k, v] for k, v in values.items()], drawn
    return measure


def _fourier(job: _Job) -> Measured:
    from timm_ext.analysis import fourier_per_block
    from timm_ext.analysis.plots import plot_fourier, plot_per_layer

    curves = fourier_per_block(job.model, job.images)
    at_pi = {k: float(v[-1]) for k, v in curves.items()}
    rows = [[k, i, float(x)] for k, v in curves.items() for i, x in enumerate(v)]
    drawn = None
    if job.plot:
        drawn = plot_fourier(curves, job.out / 'fourier.png')
        plot_per_layer({job.label: at_pi}, job.out / 'fourier_at_pi.png', 'Delta log amplitude at pi',
                       'delta log amplitude', kinds=_kinds(job.model, list(curves)))
    return dict(delta_log_amplitude=curves, at_pi=at_pi), ['layer', 'frequency_index', 'delta_log_amplitude'], \
        rows, drawn


def _hessian(job: _Job) -> Measured:
    from timm_ext.analysis import hessian_max_eigenvalue_spectrum, nep_ape
    from timm_ext.analysis.plots import plot_eigenvalues

    wd = job.weight_decay
    spectrum = job.call(hessian_max_eigenvalue_spectrum, job.model, F.cross_entropy, job.batches, progress=job.tick)
    pooled = [v for s in spectrum for v in s]
    nep, ape = nep_ape(pooled)
    rows = [[b, r, v] for b, s in enumerate(spectrum) for r, v in enumerate(s)]
    drawn = plot_eigenvalues({job.label: pooled}, job.out / 'hessian.png') if job.plot else None
    return dict(per_batch=spectrum, nep=nep, ape=ape, lambda_max=max(pooled), weight_decay=wd), \
        ['batch', 'rank', 'eigenvalue'], rows, drawn


def _trace(job: _Job) -> Measured:
    from timm_ext.analysis import hessian_trace

    summary = job.call(hessian_trace, job.model, F.cross_entropy, job.batches)
    job.tick(1)
    return summary, list(summary), [list(summary.values())], None


def _density(job: _Job) -> Measured:
    from timm_ext.analysis import hessian_spectrum_density
    from timm_ext.analysis.hessian import spectrum_density_on_grid
    from timm_ext.analysis.plots import plot_eigenvalues

    wd = job.weight_decay
    nodes, weights = job.call(hessian_spectrum_density, job.model, F.cross_entropy, job.batches)
    job.tick(1)
    rows = [[float(a), float(b)] for a, b in zip(nodes, weights)]
    drawn = None
    if job.plot:
        span = float(nodes.max() - nodes.min()) or 1.0
        grid = torch.linspace(float(nodes.min()) - 0.1 * span, float(nodes.max()) + 0.1 * span, 400)
        density = spectrum_density_on_grid(nodes, weights, grid, sigma=0.01 * span)
        drawn = plot_eigenvalues({}, job.out / 'density.png', 'Hessian eigenvalue density (SLQ)',
                                 density={job.label: (grid, density)})
    return dict(nodes=nodes, weights=weights, weight_decay=wd), ['ritz_value', 'weight'], rows, drawn


def _noise(job: _Job) -> Measured:
    from timm_ext.analysis import noisy_loss

    summary = job.call(noisy_loss, job.model, F.cross_entropy, job.batches)
    job.tick(1)
    return summary, list(summary), [list(summary.values())], None


def _landscape(job: _Job) -> Measured:
    from timm_ext.analysis import loss_landscape_1d
    from timm_ext.analysis.plots import plot_landscape_1d

    res = job.call(loss_landscape_1d, job.model, F.cross_entropy, job.batches, progress=job.tick)
    rows = [[float(a), float(v)] for a, v in zip(res['alpha'], res['loss'])]
    drawn = plot_landscape_1d({job.label: res}, job.out / 'landscape.png') if job.plot else None
    return dict(res), ['alpha', 'loss'], rows, drawn


def _landscape2d(job: _Job) -> Measured:
    from timm_ext.analysis import loss_landscape_2d
    from timm_ext.analysis.plots import plot_landscape_2d

    res = job.call(loss_landscape_2d, job.model, F.cross_entropy, job.batches, progress=job.tick)
    rows = [[float(a), float(b), float(res['loss'][i, j])] for i, a in enumerate(res['alpha'])
            for j, b in enumerate(res['beta'])]
    drawn = plot_landscape_2d(res, job.out / 'landscape2d.png') if job.plot else None
    return dict(res), ['alpha', 'beta', 'loss'], rows, drawn


def _cka(job: _Job) -> Measured:
    from timm_ext.analysis import cka_matrix
    from timm_ext.analysis.plots import plot_cka

    res = cka_matrix(job.model, job.images, other=job.other)
    rows = [[a, b, float(res['cka'][i, j])] for i, a in enumerate(res['layers'])
            for j, b in enumerate(res['other_layers'])]
    drawn = plot_cka(res, job.out / 'cka.png') if job.plot else None
    return dict(res), ['layer', 'other_layer', 'cka'], rows, drawn


def _lesion(job: _Job) -> Measured:
    from timm_ext.analysis import lesion_study
    from timm_ext.analysis.plots import plot_per_layer

    res = lesion_study(job.model, job.batches, progress=job.tick)
    drop = {k: res['baseline'] - v for k, v in res['accuracy'].items()}
    rows = [[k, v, drop[k]] for k, v in res['accuracy'].items()]
    drawn = plot_per_layer({job.label: res['accuracy']}, job.out / 'lesion.png', 'Lesion study',
                           'top-1 (%) without the unit') if job.plot else None
    return dict(res, drop=drop), ['unit', 'top1', 'drop'], rows, drawn


_MEASURE: Dict[str, Callable[[_Job], Measured]] = {
    'attention': _attention, 'tokens': _per_layer('tokens'), 'hessian': _hessian, 'trace': _trace,
    'density': _density, 'noise': _noise, 'fourier': _fourier, 'variance': _per_layer('variance'),
    'landscape': _landscape, 'landscape2d': _landscape2d, 'cka': _cka, 'lesion': _lesion,
    'activity': _per_layer('activity'),
}


def run_metric(
        metric: str,
        model: nn.Module,
        batches: List[Tuple[torch.Tensor, torch.Tensor]],
        out: os.PathLike,
        options: Optional[Dict[str, Any]] = None,
        progress: Optional[Callable[[int], None]] = None,
        other: Optional[nn.Module] = None,
        plot: bool = True,
) -> MetricResult:
    """Measure ``metric`` (a key of :data:`METRICS`) and write ``<metric>.json``, ``.csv`` and ``.png`` in ``out``.

    ``options`` (all optional; each metric uses the ones its library function takes, with that function's
    defaults): k, max_iter, weight_decay, samples, runs, iterations, sigma, steps, span, seed.
    ``progress(n)`` is called as batches or iterations finish.
    """
    if metric not in METRICS:
        raise ValueError(f'unknown metric {metric!r}: choose one of {", ".join(METRICS)}')
    options = metric_options(metric, options)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    job = _Job(model, batches, options, out, progress or (lambda n: None), other, plot)
    summary, header, rows, drawn = _MEASURE[metric](job)
    json_path = out / f'{metric}.json'
    json_path.write_text(json.dumps(_jsonable(dict(metric=metric, model=job.label, **summary)), indent=2))
    csv_path = _write_csv(out / f'{metric}.csv', header, rows)
    return MetricResult(metric, summary, json_path, csv_path, drawn)


def _ticking(images: List[torch.Tensor], tick: Callable[[int], None]):
    for x in images:
        yield x
        tick(1)
