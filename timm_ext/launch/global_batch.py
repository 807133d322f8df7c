"""The global batch (batch per process x processes x accumulation steps) of a packaged paper recipe.

A paper recipe trains at its paper's global batch (``recipes/index.csv``, ``global_batch``), and its lr
belongs to that batch. The recipe's ``grad_accum_steps`` assumes one machine size (vit-sam's: 8 GPUs x 128
x 4); ``--grad-accum-steps auto`` computes the steps for the world size and per-process batch of this command
instead, so the paper's lr applies unchanged on any cluster. timm-ext replaces ``auto`` with the number before
train.py (whose ``--grad-accum-steps`` takes an int) sees it; a numeric value passes through unchanged.

The arithmetic is solved once, by :func:`batch_splits`: ``auto`` takes its split at the command's batch, and
the check of a paper recipe run at another global batch (:mod:`timm_ext.launch.command_checks`) offers the
split nearest the command's batch as its fix.
"""
import argparse
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from timm_ext.launch.timm_scripts import script_args
from timm_ext.recipes import PaperRow, load_paper_values, packaged_row, recipes_dir

__all__ = [
    'AUTO', 'AutoAccumulation', 'GlobalBatchError', 'accumulation_steps', 'batch_splits', 'count_noun', 'lr_note',
    'paper_row', 'resolve_auto_accumulation',
]

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


def batch_splits(global_batch: int, processes: int) -> List[Tuple[int, int]]:
    """Every (batch per process, accumulation steps) with batch x ``processes`` x steps = ``global_batch``, the
    largest batch (the fewest steps) first; none when ``global_batch`` is not a multiple of ``processes``."""
    if global_batch % processes:
        return []
    per_step = global_batch // processes
    return [(batch, per_step // batch) for batch in range(per_step, 0, -1) if per_step % batch == 0]


def accumulation_steps(global_batch: int, batch: int, world: int) -> int:
    """The whole number of steps with ``batch`` x ``world`` x steps = ``global_batch``; a GlobalBatchError naming
    the per-process batch sizes (or, when none fits, the process counts) that would give it."""
    splits = batch_splits(global_batch, world)
    steps = dict(splits).get(batch)
    if steps is not None:
        return steps
    head = f'{batch} per process x {count_noun(world, "process", "es")} x whole accumulation steps'
    if not splits:
        below = max(d for d in range(1, world) if global_batch % d == 0) if world > 1 else None
        above = next((d for d in range(world + 1, global_batch + 1) if global_batch % d == 0), None)
        counts = ' or '.join(str(d) for d in (below, above) if d)
        raise GlobalBatchError(f'{head} cannot make {global_batch}, nor can any other batch on {world} processes '
                               f'({global_batch} is not a multiple of {world}): run on {counts} processes, or give '
                               f'--grad-accum-steps N with --allow-batch-change')
    sizes = [size for size, _ in splits]
    listed = ', '.join(map(str, sizes[:-1])) + f' or {sizes[-1]}' if len(sizes) > 1 else str(sizes[0])
    raise GlobalBatchError(f'{head} cannot make {global_batch}: use --batch-size {listed} ({global_batch} / '
                           f'{count_noun(world, "process", "es")} = {global_batch // world} images per step, batch x '
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
    row = paper_row(recipe) if recipe is not None else None
    if row is None:
        what = f'recipe {recipe} is not a packaged paper recipe' if recipe is not None else 'no recipe'
        raise GlobalBatchError(f'{_FLAG} auto keeps a packaged paper recipe\'s global batch (recipes/index.csv), but '
                               f'{what}: give the number of steps, {_FLAG} N')
    effective = script_args(parser, _with_steps(args, at, 1), config)
    if effective is None:  # train.py rejects another argument: let it say which
        return AutoAccumulation(_with_steps(args, at, 1), 1, '')
    try:
        steps = accumulation_steps(row.global_batch, effective.batch_size, world)
    except GlobalBatchError as e:
        raise GlobalBatchError(f'{_FLAG} auto: recipe {row.name} trains at global batch {row.global_batch} '
                               f'({row.paper} {row.table}); {e}') from None
    line = (f'global batch {row.global_batch} = {effective.batch_size} per process x '
            f'{count_noun(world, "process", "es")} x {count_noun(steps, "accumulation step")} ({_FLAG} auto: recipe '
            f'{row.name}, {row.paper} {row.table}); {lr_note(effective, row.global_batch)}')
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


def paper_row(recipe: Path) -> Optional[PaperRow]:
    """The paper row of a packaged paper recipe (None for any other file: a user's recipe has no paper batch)."""
    try:
        recipe.resolve().relative_to(recipes_dir().resolve())
    except ValueError:
        return None
    return packaged_row(recipe, _paper_rows())


@functools.lru_cache(maxsize=1)
def _paper_rows() -> Dict[str, PaperRow]:
    """The paper-values tables (package data), read once per process."""
    return load_paper_values()


def lr_note(args: argparse.Namespace, batch: int) -> str:
    """The lr train.py uses at global batch ``batch``: an explicit lr as it is, else lr_base scaled (its rule)."""
    if args.lr:
        return f'lr {args.lr:g} unchanged: train.py does not rescale an explicit lr'
    if not args.lr_base_size:
        return 'lr_base_size 0: train.py cannot scale lr_base'
    scale = args.lr_base_scale or ('sqrt' if any(o in str(args.opt).lower() for o in ('ada', 'lamb')) else 'linear')
    ratio = batch / args.lr_base_size
    lr = args.lr_base * (ratio ** 0.5 if scale == 'sqrt' else ratio)
    return f'train.py scales lr_base {args.lr_base:g} at {args.lr_base_size} ({scale}) to lr {lr:.3g}'


def count_noun(n: int, word: str, plural: str = 's') -> str:
    """'1 process', '32 processes': a count and its noun, for one-line messages."""
    return f'{n} {word}{plural if n != 1 else ""}'
