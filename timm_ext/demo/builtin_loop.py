"""The demo's own training loop, for a machine where timm's train.py cannot be had: timm's installed parts,
called the way train.py calls them.

timm's wheel has no train.py, and a machine that cannot reach GitHub cannot download it; the demo then runs
each of its runs as ``python -m timm_ext.demo.builtin_loop ARGS`` (:mod:`timm_ext.demo.routes`), one process
per run through the same runner, instead of stopping. This is not a second train.py: it takes only the
train.py arguments the demo's runs give (:data:`timm_ext.demo.runs.TRAIN_ARGS` and
:meth:`~timm_ext.demo.train_runs.TrainRun.train_args`), refuses any other in one line, and trains on the CPU
only. It calls the timm functions train.py v1.0.28 calls, with the same arguments and in the same order, so
that the random streams line up and both routes give the same top-1, image for image
(``tests/test_demo_builtin_loop.py``): the seed, the model, the data config, the datasets, the loaders with
the prefetcher, the loss, timm's ``ClassificationTask``, the optimizer, the checkpoint saver, the scheduler;
then per epoch the updates (``task(input, target)['loss']``, ``backward()``, ``optimizer.step()`` without a
closure: a SAM optimizer, opted in once with ``replay_timm_task(optimizer, task)`` as train.py's hooks opt in
every SAM timm's factory builds there, replays the task's call at w + e), the scheduler's per-update step, the
validation, ``summary.csv``, the checkpoint and the scheduler's epoch step.

It writes what train.py writes into the run folder: ``summary.csv`` (timm's ``update_summary``),
``args.yaml`` (its arguments, with train.py's values of those the demo does not give, so that ``timm-ext
validate --checkpoint RUN_FOLDER`` reads the model and the preprocessing), ``last.pth.tar`` and
``model_best.pth.tar`` through timm's ``CheckpointSaver`` (with ``args`` inside), and its log on stdout.
"""
import argparse
import inspect
import logging
import os
import sys
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence

__all__ = ['LoopArgumentError', 'PROG', 'TRAIN_PY_DEFAULTS', 'loop_parser', 'main', 'parse_loop_args', 'train']

PROG = 'python -m timm_ext.demo.builtin_loop'
_logger = logging.getLogger('timm_ext.demo.builtin_loop')

# train.py's (v1.0.28) values of the arguments the demo does not give that the loop, timm's helpers
# (optimizer_kwargs, scheduler_kwargs) and `timm-ext validate --checkpoint RUN` read
TRAIN_PY_DEFAULTS: Dict[str, Any] = dict(
    dataset='', train_split='train', val_split='validation', class_map='', input_img_mode=None,
    pretrained=False, in_chans=None, img_size=None, gp=None, drop=0.0, drop_path=None, drop_block=None,
    bn_momentum=None, bn_eps=None, torchscript=False, initial_checkpoint='',
    momentum=0.9, opt_eps=None, opt_betas=None, layer_decay=None, layer_decay_min_scale=0,
    layer_decay_no_opt_scale=None,
    decay_epochs=90, decay_milestones=[90, 180, 270], cooldown_epochs=0, patience_epochs=10, decay_rate=0.1,
    warmup_prefix=False, lr_noise=None, lr_noise_pct=0.67, lr_noise_std=1.0, lr_cycle_mul=1.0, lr_cycle_decay=0.5,
    lr_cycle_limit=1, lr_k_decay=1.0, eval_metric='top1',
    amp=False, amp_dtype='float16', channels_last=False, model_dtype=None, model_ema=False,
)

# the arguments the demo's runs give, typed as train.py types them: (option, type, nargs)
_OPTIONS = (
    ('--data-dir', str, None), ('--output', str, None), ('--experiment', str, None), ('--model', str, None),
    ('--epochs', int, None), ('--opt', str, None), ('--num-classes', int, None), ('--input-size', int, 3),
    ('--crop-pct', float, None), ('--mean', float, '+'), ('--std', float, '+'), ('--interpolation', str, None),
    ('--train-interpolation', str, None), ('--scale', float, '+'), ('--ratio', float, '+'), ('--hflip', float, None),
    ('--color-jitter', float, None), ('--smoothing', float, None), ('--batch-size', int, None),
    ('--validation-batch-size', int, None), ('--lr', float, None), ('--weight-decay', float, None),
    ('--sched', str, None), ('--warmup-epochs', int, None), ('--warmup-lr', float, None), ('--min-lr', float, None),
    ('--workers', int, None), ('--log-interval', int, None), ('--checkpoint-hist', int, None), ('--seed', int, None),
)


class LoopArgumentError(ValueError):
    """An argument the built-in loop does not take, or a value it cannot use (one line)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, raised: no usage block, no exit from a library call
        raise LoopArgumentError(message)


def loop_parser() -> argparse.ArgumentParser:
    """The loop's parser: the demo's train.py options, each required, plus ``--sched-on-updates`` and the kwargs."""
    from timm.utils import ParseKwargs

    parser = _Parser(prog=PROG, allow_abbrev=False, add_help=False)
    for option, kind, nargs in _OPTIONS:
        parser.add_argument(option, type=kind, nargs=nargs, required=True)
    parser.add_argument('--device', choices=['cpu'], required=True)
    parser.add_argument('--sched-on-updates', action='store_true', default=False)
    parser.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs)
    parser.add_argument('--opt-kwargs', nargs='*', default={}, action=ParseKwargs)
    return parser


def parse_loop_args(argv: Sequence[str]) -> argparse.Namespace:
    """train.py's namespace for the demo's arguments ``argv``: ``TRAIN_PY_DEFAULTS`` plus what ``argv`` gives.

    Raises :class:`LoopArgumentError` naming the first argument the loop does not take, or argparse's line
    for a missing or bad value."""
    args, extra = loop_parser().parse_known_args(list(argv), argparse.Namespace(**TRAIN_PY_DEFAULTS))
    if extra:
        raise LoopArgumentError(
            f'{extra[0]} is not an argument of the demo\'s built-in loop, which takes only the train.py arguments of '
            f'`timm-ext demo`\'s runs; for any other, train with timm\'s train.py (timm-ext train --timm-train PATH)')
    return args


def train(args: argparse.Namespace) -> Optional[float]:
    """Train and validate as train.py does with ``args`` (from :func:`parse_loop_args`); returns the best top-1."""
    import torch
    import torch.nn as nn
    import yaml

    import timm_ext.models  # noqa: F401 (registers timm-ext's models with timm)
    import timm_ext.optim  # noqa: F401 (registers SAM with timm's optimizer factory)
    from timm_ext._timm_backports import apply_backports
    from timm_ext.optim import replay_timm_task
    from timm_ext.optim.task_replay import sams_in

    apply_backports()  # timm 1.0.23 ... 1.0.28: create_loader with --workers 0
    from timm import utils
    from timm.data import create_dataset, create_loader, resolve_data_config
    from timm.loss import LabelSmoothingCrossEntropy
    from timm.models import create_model
    from timm.optim import create_optimizer_v2, optimizer_kwargs
    from timm.scheduler import create_scheduler_v2, scheduler_kwargs
    from timm.task import ClassificationTask

    utils.setup_default_logging()
    args_text = yaml.safe_dump(args.__dict__, default_flow_style=False)  # args.yaml holds the arguments as parsed
    args.prefetcher, args.grad_accum_steps = True, 1
    args.distributed, args.world_size, args.rank, args.local_rank = False, 1, 0, 0
    device = torch.device(args.device)
    _logger.info(f'Training with the demo\'s built-in loop on 1 device ({args.device}).')

    utils.random_seed(args.seed, args.rank)
    model = create_model(
        args.model, pretrained=args.pretrained, in_chans=args.input_size[0], num_classes=args.num_classes,
        drop_rate=args.drop, drop_path_rate=args.drop_path, drop_block_rate=args.drop_block, global_pool=args.gp,
        bn_momentum=args.bn_momentum, bn_eps=args.bn_eps, scriptable=args.torchscript,
        checkpoint_path=args.initial_checkpoint, **args.model_kwargs)
    _logger.info(f'Model {args.model} created, param count:{sum(p.numel() for p in model.parameters())}')
    data_config = resolve_data_config(vars(args), model=model, verbose=True)
    model.to(device=device)

    img_mode = 'RGB' if data_config['input_size'][0] == 3 else 'L'
    dataset_train = create_dataset(args.dataset, root=args.data_dir, split=args.train_split, is_training=True,
                                   class_map=args.class_map, batch_size=args.batch_size, seed=args.seed,
                                   input_img_mode=img_mode)
    dataset_eval = create_dataset(args.dataset, root=args.data_dir, split=args.val_split, is_training=False,
                                  class_map=args.class_map, batch_size=args.batch_size, input_img_mode=img_mode)
    common = dict(mean=data_config['mean'], std=data_config['std'], device=device, use_prefetcher=args.prefetcher)
    loader_train = create_loader(
        dataset_train, input_size=data_config['input_size'], batch_size=args.batch_size, is_training=True,
        scale=args.scale, ratio=args.ratio, hflip=args.hflip, color_jitter=args.color_jitter,
        interpolation=args.train_interpolation or data_config['interpolation'], num_workers=args.workers, **common)
    loader_eval = create_loader(
        dataset_eval, input_size=data_config['input_size'], batch_size=args.validation_batch_size,
        is_training=False, interpolation=data_config['interpolation'], num_workers=args.workers,
        crop_pct=data_config['crop_pct'], **common)

    train_loss_fn = LabelSmoothingCrossEntropy(smoothing=args.smoothing) if args.smoothing else nn.CrossEntropyLoss()
    train_loss_fn = train_loss_fn.to(device=device)
    validate_loss_fn = nn.CrossEntropyLoss().to(device=device)
    task = ClassificationTask(model=model, criterion=train_loss_fn, device=device, verbose=True)
    if hasattr(task, 'get_trainable_module'):  # timm >= 1.0.24; before, the task trains the model it was given
        model, eval_model = task.get_trainable_module(), task.get_eval_model()
    else:
        eval_model = model
    optimizer = create_optimizer_v2(model, **optimizer_kwargs(cfg=args), **args.opt_kwargs)
    if sams_in(optimizer):  # SAM's step() without a closure replays this task's call at w + e (train.py's hooks)
        replay_timm_task(optimizer, task)
    _logger.info(f'Created {type(optimizer).__name__} ({args.opt}) optimizer')

    output_dir = utils.get_outdir(args.output, args.experiment)
    with_task = {'task': task} if 'task' in inspect.signature(utils.CheckpointSaver).parameters else {}
    saver = utils.CheckpointSaver(model=model, optimizer=optimizer, args=args, checkpoint_dir=output_dir,
                                  recovery_dir=output_dir, decreasing=False, max_history=args.checkpoint_hist,
                                  **with_task)
    with open(os.path.join(output_dir, 'args.yaml'), 'w') as f:
        f.write(args_text)
    updates_per_epoch = len(loader_train)
    lr_scheduler, num_epochs = create_scheduler_v2(
        optimizer, **scheduler_kwargs(args, decreasing_metric=False), updates_per_epoch=updates_per_epoch)

    best_metric = best_epoch = None
    for epoch in range(num_epochs):
        if hasattr(dataset_train, 'set_epoch'):
            dataset_train.set_epoch(epoch)
        train_metrics = _train_one_epoch(epoch, task, model, loader_train, optimizer, lr_scheduler,
                                         args.log_interval)
        eval_metrics = _validate(eval_model, loader_eval, validate_loss_fn)
        lrs = [group['lr'] for group in optimizer.param_groups]
        utils.update_summary(epoch, train_metrics, eval_metrics, filename=os.path.join(output_dir, 'summary.csv'),
                             lr=sum(lrs) / len(lrs), write_header=best_metric is None)
        latest_metric = eval_metrics[args.eval_metric]
        best_metric, best_epoch = saver.save_checkpoint(epoch, metric=latest_metric)
        lr_scheduler.step(epoch + 1, latest_metric)
    _logger.info(f'*** Best metric: {best_metric} (epoch {best_epoch})')
    return best_metric


def _train_one_epoch(epoch: int, task: Any, model: Any, loader: Any, optimizer: Any, lr_scheduler: Any,
                     log_interval: int) -> Dict[str, float]:
    """One epoch of updates, one per batch; the per-update scheduler step and the log as train.py has them."""
    from timm import utils

    losses = utils.AverageMeter()
    model.train()
    updates_per_epoch = len(loader)
    num_updates = epoch * updates_per_epoch
    optimizer.zero_grad()
    for batch_idx, (input, target) in enumerate(loader):
        loss = task(input, target)['loss']
        loss.backward()
        optimizer.step()  # no closure: a SAM optimizer re-runs this task call at w + e (replay_timm_task above)
        losses.update(loss.item(), input.shape[0])
        num_updates += 1
        optimizer.zero_grad()
        if batch_idx % log_interval == 0 or batch_idx == updates_per_epoch - 1:
            lrs = [group['lr'] for group in optimizer.param_groups]
            _logger.info(f'Train: {epoch} [{batch_idx:>4d}/{updates_per_epoch}]  Loss: {losses.val:#.3g} '
                         f'({losses.avg:#.3g})  LR: {sum(lrs) / len(lrs):.3e}')
        lr_scheduler.step_update(num_updates=num_updates, metric=losses.avg)
    return OrderedDict([('loss', losses.avg)])


def _validate(model: Any, loader: Any, loss_fn: Any) -> Dict[str, float]:
    """Loss, top-1 and top-5 over the validation images, in eval mode."""
    import torch
    from timm import utils

    losses, top1, top5 = utils.AverageMeter(), utils.AverageMeter(), utils.AverageMeter()
    model.eval()
    with torch.inference_mode():
        for input, target in loader:
            output = model(input)
            if isinstance(output, (tuple, list)):
                output = output[0]
            loss = loss_fn(output, target)
            acc1, acc5 = utils.accuracy(output, target, topk=(1, 5))
            batch_size = output.shape[0]
            losses.update(loss.item(), batch_size)
            top1.update(acc1.item(), batch_size)
            top5.update(acc5.item(), batch_size)
    _logger.info(f'Test: Loss: {losses.avg:>6.3f}  Acc@1: {top1.avg:>7.3f}  Acc@5: {top5.avg:>7.3f}')
    return OrderedDict([('loss', losses.avg), ('top1', top1.avg), ('top5', top5.avg)])


def _problem(args: argparse.Namespace) -> Optional[str]:
    """One line for a model or data folder the loop cannot use (after the models are registered)."""
    import timm

    import timm_ext.models  # noqa: F401 (registers timm-ext's models with timm)

    if not timm.is_model(args.model):
        return f'--model {args.model}: no such model in timm or timm-ext (timm-ext models lists them)'
    for split in (args.train_split, args.val_split):
        if not os.path.isdir(os.path.join(args.data_dir, split)):
            return f'--data-dir {args.data_dir} has no {split}/ folder: give an ImageFolder with train/ and validation/'
    return None


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m timm_ext.demo.builtin_loop ARGS``: 0 when trained, 2 with one line for an argument it refuses."""
    try:
        args = parse_loop_args(sys.argv[1:] if argv is None else argv)
    except LoopArgumentError as e:
        print(f'{PROG}: error: {e}', file=sys.stderr)
        return 2
    problem = _problem(args)
    if problem:
        print(f'{PROG}: error: {problem}', file=sys.stderr)
        return 2
    train(args)
    return 0


if __name__ == '__main__':
    sys.exit(main())
