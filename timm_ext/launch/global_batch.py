"""``--grad-accum-steps auto``: the accumulation steps that keep a packaged paper recipe's global batch.

A paper recipe trains at its paper's global batch (``recipes/index.csv``, ``global_batch``), and its lr
belongs to that batch. The recipe's ``grad_accum_steps`` assumes one machine size (vit-sam's: 8 GPUs x 128
x 4); ``auto`` computes the steps for the world size and per-process batch of this command instead, so the
paper's lr applies unchanged on any cluster. timm-ext replaces ``auto`` with the number before train.py
(whose ``--grad-accum-steps`` takes an int) sees it; a numeric value passes through unchanged.
"""
import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from timm_ext.launch import preflight

__all__ = ['AUTO', 'AutoAccumulation', 'GlobalBatchError', 'accumulation_steps', 'resolve_auto_accumulation']

AUTO = 'auto'
_FLAG = '--grad-accum-steps'


class GlobalBatchError(ValueError):
    """``--grad-accum-steps auto`` cannot give the recipe's global batch (one line, with what would)."""


@dataclass(frozen=True)
class AutoAccumulation:
    """train.py's arguments with the steps in place of ``auto``, and the line that says what they give."""
    train_args: List[str]
    steps: int
    line: str


def accumulation_steps(global_batch: int, batch: int, world: int) -> int:
    """The whole number of steps with ``batch`` x ``world`` x steps = ``global_batch``; a GlobalBatchError naming
    the per-process batch sizes (or, when none fits, the process counts) that would give it."""
    if batch >= 1 and global_batch % (batch * world) == 0:
        return global_batch // (batch * world)
    head = f'{batch} per process x {preflight.count_noun(world, "process", "es")} x whole accumulation steps'
    if global_batch % world:
        below = max(d for d in range(1, world) if global_batch % d == 0) if world > 1 else None
        above = next((d for d in range(world + 1, global_batch + 1) if global_batch % d == 0), None)
        counts = ' or '.join(str(d) for d in (below, above) if d)
        raise GlobalBatchError(f'{head} cannot make {global_batch}, nor can any other batch on {world} processes '
                               f'({global_batch} is not a multiple of {world}): run on {counts} processes, or give '
                               f'--grad-accum-steps N with --allow-batch-change')
    per_step = global_batch // world
    sizes = [d for d in range(per_step, 0, -1) if per_step % d == 0]
    listed = ', '.join(map(str, sizes[:-1])) + f' or {sizes[-1]}' if len(sizes) > 1 else str(sizes[0])
    raise GlobalBatchError(f'{head} cannot make {global_batch}: use --batch-size {listed} ({global_batch} / '
                           f'{preflight.count_noun(world, "process", "es")} = {per_step} images per step, batch x '
                           f'accumulation steps)')


def resolve_auto_accumulation(
        parser: argparse.ArgumentParser,
        train_args: Sequence[str],
        recipe: Optional[Path],
        config: Dict[str, Any],
        world: int,
) -> Optional[AutoAccumulation]:
    """``auto`` in ``train_args`` (``--grad-accum-steps auto`` or ``=auto``) resolved for ``world`` processes and the
    per-process batch train.py will use (command line, else ``recipe``'s ``config``); None without ``auto``."""
    args = list(train_args)
    at = [i for i, a in enumerate(args) if a == f'{_FLAG}={AUTO}' or (a == _FLAG and args[i + 1:i + 2] == [AUTO])]
    if not at:
        return None
    row = preflight.paper_row(recipe) if recipe is not None else None
    if row is None:
        what = f'recipe {recipe} is not a packaged paper recipe' if recipe is not None else 'no recipe'
        raise GlobalBatchError(f'{_FLAG} auto keeps a packaged paper recipe\'s global batch (recipes/index.csv), but '
                               f'{what}: give the number of steps, {_FLAG} N')
    effective = preflight.script_args(parser, _with_steps(args, at, 1), config)
    if effective is None:  # train.py rejects another argument: let it say which
        return AutoAccumulation(_with_steps(args, at, 1), 1, '')
    try:
        steps = accumulation_steps(row.global_batch, effective.batch_size, world)
    except GlobalBatchError as e:
        raise GlobalBatchError(f'{_FLAG} auto: recipe {row.name} trains at global batch {row.global_batch} '
                               f'({row.paper} {row.table}); {e}') from None
    count = preflight.count_noun
    line = (f'global batch {row.global_batch} = {effective.batch_size} per process x {count(world, "process", "es")} '
            f'x {count(steps, "accumulation step")} ({_FLAG} auto: recipe {row.name}, {row.paper} {row.table}); '
            f'{preflight.lr_note(effective, row.global_batch)}')
    return AutoAccumulation(_with_steps(args, at, steps), steps, line)


def _with_steps(args: List[str], at: Sequence[int], steps: int) -> List[str]:
    """``args`` with each ``auto`` at the positions ``at`` replaced by ``steps``."""
    out = list(args)
    for i in at:
        if out[i] == _FLAG:
            out[i + 1] = str(steps)
        else:
            out[i] = f'{_FLAG}={steps}'
    return out
