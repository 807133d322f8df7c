"""The one training route: the command that runs timm's own train.py (or validate.py) with timm-ext loaded.

``timm-ext train``, ``timm-ext demo`` and Python users share these functions: find and verify the script
(:mod:`timm_ext.launch.timm_scripts`), run every check of the recipe and arguments before anything starts
(:mod:`timm_ext.launch.command_checks`), and build the command line of the child process (``python train.py ...
--device-modules timm_ext`` or ``python -m torch.distributed.run ... train.py ...``, on one node or several:
:mod:`timm_ext.launch.distributed`; ``--grad-accum-steps auto``: :mod:`timm_ext.launch.global_batch`).
There is no second training loop: the command runs timm's script unchanged.
"""
import argparse
import os
import site
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from timm_ext._timm_backports import LOADER_FIXED_IN, needs_fix
from timm_ext.launch.command_checks import check_train_command, check_validate_command, ddp_on_cpu_problems
from timm_ext.launch.cpu_threads import cpu_thread_env
from timm_ext.launch.distributed import Launch
from timm_ext.launch.global_batch import GlobalBatchError, resolve_auto_accumulation
from timm_ext.launch.timm_scripts import ScriptError, TimmScript, find_script, load_script_parser, script_args
from timm_ext.recipes import RecipeError, find_recipe, load_recipe

__all__ = [
    'TrainCommand', 'TrainConfigError', 'build_train_command', 'build_validate_command', 'child_env',
    'resolve_script',
]


# imports the given modules (timm_ext among them), then runs the script as __main__
_RUNNER = ('-m', 'timm_ext.cli._child')


class TrainConfigError(ValueError):
    """The script cannot be found, or the recipe/arguments would not do what they say (one line per problem)."""


@dataclass(frozen=True)
class TrainCommand:
    """A resolved command: the argv of the child process, the script it runs, what the checks let pass with a
    warning (one line each, e.g. a paper recipe at another global batch with ``allow_batch_change``), and notes
    to show at start (one line each: where SLURM's rendezvous is, the global batch of ``--grad-accum-steps auto``).
    ``env``: variables the child's environment gets on top of :func:`child_env` (the CPU thread count), and
    ``env_note`` the line that says why (empty when the user chose)."""
    argv: List[str]
    script: TimmScript
    warnings: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    args: Optional[argparse.Namespace] = None  # what the script will parse (recipe and arguments), when known
    env: Mapping[str, str] = field(default_factory=dict)
    env_note: str = ''


def resolve_script(name: str, path: Optional[Union[str, Path]] = None, allow_unverified: bool = False) -> TimmScript:
    """:func:`~timm_ext.launch.timm_scripts.find_script` with its refusal as a TrainConfigError (its one wrapper)."""
    try:
        return find_script(name, path=path, allow_unverified=allow_unverified)
    except ScriptError as e:
        raise TrainConfigError(str(e)) from None


def _device_modules(effective: Any) -> List[str]:
    """``--device-modules timm_ext ...`` when the command line and recipe do not load timm_ext yet."""
    modules = getattr(effective, 'device_modules', None) if effective is not None else None
    if isinstance(modules, (list, tuple)) and 'timm_ext' in modules:
        return []
    if isinstance(modules, str):  # a recipe's string (checks skipped): train.py would iterate its characters
        modules = [modules]
    return ['--device-modules', *dict.fromkeys(['timm_ext', *(modules or [])])]


def build_train_command(
        train_args: Sequence[str] = (),
        recipe: Optional[Union[str, Path]] = None,
        timm_train: Optional[Union[str, Path]] = None,
        allow_unverified: bool = False,
        nproc_per_node: Optional[int] = None,
        check: bool = True,
        script: Optional[TimmScript] = None,
        allow_batch_change: bool = False,
        launch: Optional[Launch] = None,
        threads: Optional[int] = None,
) -> TrainCommand:
    """The command that runs timm's train.py with ``recipe`` (a path or packaged name) and ``train_args``.

    With ``check``, the recipe and the arguments are validated against train.py's own parser first and
    every problem is raised at once as a TrainConfigError (one line each, each with its fix).
    ``allow_batch_change``: a packaged paper recipe may run at another global batch than its paper's (the
    command then carries a warning). ``nproc_per_node``: torchrun ``--standalone`` on this node; ``launch``
    instead: torchrun on one node or several (:func:`~timm_ext.launch.distributed.resolve_launch`, which also
    reads SLURM). The checks count ``launch.world_size`` processes. ``--grad-accum-steps auto`` in
    ``train_args`` becomes the steps that keep a packaged paper recipe's global batch at that world size.
    ``threads``: CPU threads per train.py process (:func:`~timm_ext.launch.cpu_threads.cpu_thread_env`: on the CPU,
    the cores free at start shared among the node's processes, unless this or ``OMP_NUM_THREADS`` says otherwise).
    """
    if nproc_per_node is not None and launch is not None:
        raise TrainConfigError('give nproc_per_node or launch, not both (launch has its own nproc_per_node)')
    if nproc_per_node is not None:
        if nproc_per_node < 1:
            raise TrainConfigError(f'--nproc-per-node must be at least 1, got {nproc_per_node}')
        launch = Launch(nproc_per_node)
    world = launch.world_size if launch is not None else 1
    script = script or resolve_script('train.py', timm_train, allow_unverified)
    recipe_path: Optional[Path] = None
    config: Dict[str, Any] = {}
    if recipe is not None:
        try:
            recipe_path = find_recipe(recipe)
            config = load_recipe(recipe_path)
        except RecipeError as e:
            raise TrainConfigError(str(e)) from None
    parser = load_script_parser(script.path)
    extra = list(train_args)
    notes = list(launch.notes) if launch is not None else []
    try:
        auto = resolve_auto_accumulation(parser, extra, recipe_path, config, world)
    except GlobalBatchError as e:
        raise TrainConfigError(str(e)) from None
    if auto is not None:
        extra = auto.train_args
        notes += [auto.line] if auto.line else []
    warnings: Tuple[str, ...] = ()
    if check:
        found = check_train_command(parser, extra, recipe_path, config, processes=world,
                                    allow_batch_change=allow_batch_change, script_dir=script.path.parent)
        if found.problems:
            raise TrainConfigError('\n'.join(found.problems))
        warnings = tuple(found.warnings)
        notes += found.notes
    effective = script_args(parser, extra, config)  # what the child parses
    refused = ddp_on_cpu_problems(effective, world, script)
    if refused:
        raise TrainConfigError('\n'.join(refused))
    on_cpu = str(getattr(effective, 'device', None) or '').startswith('cpu')
    try:
        env, thread_note = cpu_thread_env(threads, os.environ, on_cpu, processes=launch.nproc_per_node if launch else 1)
    except ValueError as e:
        raise TrainConfigError(str(e)) from None
    args = (['-c', str(recipe_path)] if recipe_path else []) + extra + _device_modules(effective)
    # train.py binds timm's create_loader before it imports timm_ext: on a timm with that bug, the runner
    # imports timm_ext (and its fix, timm_ext._timm_backports) first
    target = [*_RUNNER, 'timm_ext', str(script.path)] if needs_fix(LOADER_FIXED_IN) else [str(script.path)]
    if launch is None:
        argv = [sys.executable, *target, *args]
    else:
        argv = [sys.executable, '-m', 'torch.distributed.run', *launch.torchrun_args(), *target, *args]
    return TrainCommand(argv=argv, script=script, warnings=warnings, notes=tuple(notes), args=effective, env=env,
                        env_note=thread_note)


def build_validate_command(
        validate_args: Sequence[str] = (),
        timm_validate: Optional[Union[str, Path]] = None,
        allow_unverified: bool = False,
        imports: Sequence[str] = (),
        check: bool = True,
        script: Optional[TimmScript] = None,
) -> TrainCommand:
    """The command that runs timm's validate.py with timm_ext (and ``imports``) imported first.

    validate.py has no ``--device-modules``, so a small runner (``timm_ext.cli._child``) imports the
    modules and then runs the unchanged script as ``__main__``.
    """
    script = script or resolve_script('validate.py', timm_validate, allow_unverified)
    extra = list(validate_args)
    if check:
        problems = check_validate_command(load_script_parser(script.path), extra, imports,
                                          script_dir=script.path.parent).problems
        if problems:
            raise TrainConfigError('\n'.join(problems))
    modules = ','.join(dict.fromkeys(['timm_ext', *imports]))
    argv = [sys.executable, *_RUNNER, modules, str(script.path), *extra]
    return TrainCommand(argv=argv, script=script)


def child_env() -> Dict[str, str]:
    """The environment for timm's script: the same timm_ext as this process, even from a source checkout."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    site_dirs = {str(Path(p).resolve()) for p in site.getsitepackages() + [site.getusersitepackages()]}
    if root not in site_dirs:
        env['PYTHONPATH'] = os.pathsep.join(p for p in (root, env.get('PYTHONPATH')) if p)
    return env
