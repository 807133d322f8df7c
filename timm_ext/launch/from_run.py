"""A train.py run read back for validate.py: the model, its arguments and the preprocessing of its evaluation.

train.py records its whole namespace in every checkpoint (``args``, with ``arch``) and in ``args.yaml`` beside
it. validate.py reads none of it: without ``--model`` it builds its default ``dpn92``, and without
``--mean/--std``, ``--img-size`` or ``--crop-pct`` it takes the model's pretrained config, so a checkpoint
trained with other values scores a different top-1 than train.py printed, silently. :func:`validate_args_from_run`
gives validate.py the values train.py evaluated with; the user's own flags still win, and each is reported.

A run folder whose ``args.yaml`` is gone is still a run: its checkpoint carries the same arguments
(:func:`read_folder_run`). Without ``--model``, such a folder is never handed to validate.py, which would validate
every file in it with its default ``dpn92`` and exit 0. The classes of the folder validate.py reads are compared
with the run's before it starts (:mod:`timm_ext.launch.run_classes`).
"""
import argparse
import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from timm_ext._timm_compat import parser_actions
from timm_ext.launch.run_classes import ClassCheck, class_check

__all__ = ['RunError', 'RunSettings', 'ValidateFromRun', 'fit_problem', 'is_run_folder', 'read_folder_run', 'read_run',
           'run_checkpoint', 'validate_args_from_run', 'validate_command_from_run']

LAST, BEST = 'last.pth.tar', 'model_best.pth.tar'


class RunError(ValueError):
    """The run, its checkpoint or the user's flags cannot give what train.py evaluated (one line)."""


@dataclass(frozen=True)
class RunSettings:
    """What train.py recorded of a run: the checkpoint, the architecture and train.py's arguments."""
    checkpoint: Path
    arch: Optional[str]
    args: Dict[str, Any]
    source: str  # where ``args`` came from: the checkpoint, or the args.yaml beside it
    state_shapes: Dict[str, Tuple[int, ...]] = field(default_factory=dict)
    has_ema: bool = False


@dataclass(frozen=True)
class ValidateFromRun:
    """validate.py's arguments with the run's values added, what was taken (one line each), the flags the user
    gave that change the result against train.py's (one line each)."""
    args: List[str]
    taken: List[str]
    overrides: List[str]


def run_checkpoint(path: Union[str, Path], best: bool = False) -> Path:
    """``path`` itself, or in a run folder its ``last.pth.tar`` (``model_best.pth.tar`` with ``best``)."""
    path = Path(path).expanduser()
    if not path.is_dir():
        if best:
            raise RunError(f'--best picks model_best.pth.tar in a run folder, and {path} is a file: give the folder')
        return path
    name = BEST if best else LAST
    if (path / name).is_file():
        return path / name
    found = sorted(p.name for p in path.glob('*.pth*'))
    raise RunError(f'run folder {path} has no {name} (it has {", ".join(found) or "no checkpoint"}): '
                   f'give a checkpoint file with --checkpoint')


def read_run(path: Union[str, Path], best: bool = False) -> RunSettings:
    """The run behind ``path`` (a checkpoint file or a run folder); args from the checkpoint, else args.yaml."""
    from timm_ext.hub import HubError, load_checkpoint

    checkpoint = run_checkpoint(path, best)
    try:
        ckpt = load_checkpoint(checkpoint)
    except HubError as e:
        raise RunError(str(e)) from None
    args, source = dict(ckpt.train_args), f'{checkpoint.name}'
    yaml_file = checkpoint.parent / 'args.yaml'
    if not args and yaml_file.is_file():
        import yaml
        loaded = yaml.safe_load(yaml_file.read_text())
        args, source = (loaded if isinstance(loaded, dict) else {}), str(yaml_file.name)
    has_ema = False
    if args.get('model_ema'):  # a second read, only for runs that kept an EMA
        try:
            has_ema = load_checkpoint(checkpoint, use_ema=True).ema
        except HubError:
            has_ema = False
    return RunSettings(checkpoint, ckpt.arch or args.get('model'), args, source,
                       {k: tuple(v.shape) for k, v in ckpt.state_dict.items()}, has_ema)


def read_folder_run(
        folder: Union[str, Path], best: bool = False, model_given: bool = False, default_model: str = 'dpn92',
) -> Tuple[RunSettings, Optional[str]]:
    """The run of a folder without ``args.yaml``, read from the arguments train.py saved in its checkpoint (its
    last.pth.tar; model_best.pth.tar with ``best``; else its one checkpoint), and a note naming the checkpoint when
    the folder holds several. RunError (one line, naming the files to give) for a folder without a checkpoint, with
    several and none of train.py's names, or whose checkpoint holds no model name when ``--model`` is not given
    (validate.py would validate each file with ``default_model``)."""
    folder = Path(folder).expanduser()
    found = sorted({p.name for p in folder.glob('*.pth.tar')} | {p.name for p in folder.glob('*.pth')})
    if not found:
        raise RunError(f'--checkpoint {folder} holds no checkpoint (*.pth.tar, *.pth) and no args.yaml: give the '
                       f'folder train.py wrote (OUTPUT/train/RUN) or a checkpoint file')
    name = next((n for n in ([BEST] if best else [LAST, BEST]) if n in found), found[0] if len(found) == 1 else None)
    if best and name != BEST:
        raise RunError(f'run folder {folder} has no {BEST} (it has {", ".join(found)}): give a checkpoint file with '
                       f'--checkpoint')
    if name is None:
        raise RunError(f'--checkpoint {folder} holds {len(found)} checkpoints ({", ".join(found)}) and no args.yaml or '
                       f'{LAST}: give one, e.g. --checkpoint {folder / found[-1]} (with --model NAME if it holds no '
                       f'train.py arguments), or --model NAME to validate each')
    run = read_run(folder / name)
    if not run.arch and not model_given:
        which = 'the checkpoint' if len(found) == 1 else f'one of its checkpoints ({", ".join(found)})'
        raise RunError(f'{folder / name} holds no train.py arguments and {folder} has no args.yaml, so its model is '
                       f'unknown (validate.py would validate every file there with its default {default_model}): '
                       f'give {which} and its model: --checkpoint {folder / name} --model NAME')
    if len(found) == 1:
        return run, None
    other = f'--best takes {BEST}, ' if BEST in found and not best else ''
    return run, (f'{folder} has no args.yaml: validating {name} with the arguments train.py saved in it (the folder '
                 f'holds {", ".join(found)}; {other}--checkpoint FILE another)')


def _kwarg_value(value: Any) -> str:
    """How timm's ParseKwargs (``ast.literal_eval``, else the string itself) gets ``value`` back."""
    if isinstance(value, str):
        try:
            ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value  # read back as this very string
    return repr(value)


def _kwargs_values(kwargs: Dict[str, Any]) -> List[str]:
    return [f'{k}={_kwarg_value(v)}' for k, v in kwargs.items()]


def _seq(value: Any) -> List[str]:
    return [str(v) for v in value]


# validate.py dest <- (train.py dest, how to write the value as arguments, whether a different value changes
# the top-1 against train.py's); each is taken only when train.py recorded a value and validate.py has the flag
_FROM_TRAIN: Tuple[Tuple[str, str, Callable[[Any], List[str]], bool], ...] = (
    ('model_kwargs', 'model_kwargs', _kwargs_values, True),
    ('num_classes', 'num_classes', lambda v: [str(v)], True),
    ('in_chans', 'in_chans', lambda v: [str(v)], True),
    ('gp', 'gp', lambda v: [str(v)], True),
    ('input_size', 'input_size', _seq, True),
    ('img_size', 'img_size', lambda v: [str(v)], True),
    ('crop_pct', 'crop_pct', lambda v: [str(v)], True),
    ('crop_mode', 'crop_mode', lambda v: [str(v)], True),
    ('interpolation', 'interpolation', lambda v: [str(v)], True),
    ('mean', 'mean', _seq, True),
    ('std', 'std', _seq, True),
    ('amp', 'amp', lambda v: [], False),
    ('amp_dtype', 'amp_dtype', lambda v: [str(v)], False),
    ('channels_last', 'channels_last', lambda v: [], False),
    ('model_dtype', 'model_dtype', lambda v: [str(v)], False),
    ('device', 'device', lambda v: [str(v)], False),
    ('data_dir', 'data_dir', lambda v: [str(v)], False),
    ('dataset', 'dataset', lambda v: [str(v)], False),
    ('split', 'val_split', lambda v: [str(v)], False),
    ('class_map', 'class_map', lambda v: [str(v)], False),
    ('input_img_mode', 'input_img_mode', lambda v: [str(v)], False),
)


def _flags(parser: argparse.ArgumentParser) -> Dict[str, argparse.Action]:
    return {a.dest: a for a in parser_actions(parser) if a.option_strings}


def _given(parser: argparse.ArgumentParser, argv: Sequence[str], parsed: argparse.Namespace) -> set:
    """Dests the user set: an option string on the command line (or its ``--opt=value`` form), or a value
    other than the default."""
    given = set()
    for dest, action in _flags(parser).items():
        if any(tok in action.option_strings or tok.split('=', 1)[0] in action.option_strings for tok in argv):
            given.add(dest)
        elif getattr(parsed, dest, None) != action.default:
            given.add(dest)
    return given


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return ' '.join(_kwargs_values(value))
    if isinstance(value, (list, tuple)):
        return ' '.join(str(v) for v in value)
    return str(value)


def _recorded(value: Any) -> bool:
    return value not in (None, '', [], {}, False)


def is_run_folder(path: Union[str, Path]) -> bool:
    """A folder train.py wrote (its ``args.yaml`` is there), as opposed to a folder of checkpoints, which
    validate.py validates one by one."""
    path = Path(path).expanduser()
    return path.is_dir() and (path / 'args.yaml').is_file()


def validate_command_from_run(
        parser: argparse.ArgumentParser,
        argv: Sequence[str],
        best: bool = False,
) -> Optional[ValidateFromRun]:
    """validate.py's ``argv`` completed from the run of its ``--checkpoint`` (a file, or a run folder: its
    last.pth.tar, or model_best.pth.tar with ``best``; a folder without args.yaml: :func:`read_folder_run`); None
    when there is no checkpoint, or it is a folder of checkpoints given with ``--model`` (validate.py validates each).
    The validation folder's classes are compared with the run's (:func:`~timm_ext.launch.run_classes.class_check`):
    some of the run's named classes are mapped by name (``--class-map``, with a note). Raises RunError (one line)
    when the run cannot be read, the model does not fit it, or the folder's classes are not the run's."""
    parsed = parser.parse_known_args(list(argv))[0]
    path = getattr(parsed, 'checkpoint', None)
    if not path:
        if best:
            raise RunError('--best picks model_best.pth.tar of the run folder given with --checkpoint: add it')
        return None
    if not Path(path).expanduser().exists():
        return None  # the argument checks say so
    model_given = 'model' in _given(parser, argv, parsed)
    folder = Path(path).expanduser().is_dir() and not is_run_folder(path)
    if folder and model_given and not best:
        return None  # a folder of checkpoints: validate.py validates each with --model
    run, note = read_folder_run(path, best, model_given, parser.get_default('model')) if folder else (
        read_run(path, best), None)
    kept = _without_option(list(argv), '--checkpoint') + ['--checkpoint', str(run.checkpoint)]
    result = validate_args_from_run(parser, kept, run)
    if note:
        result = ValidateFromRun(result.args, [note, *result.taken], result.overrides)
    final = parser.parse_known_args(result.args)[0]
    kwargs = dict(final.model_kwargs or {})
    for dest in ('num_classes', 'in_chans'):
        if getattr(final, dest, None) is not None:
            kwargs[dest] = getattr(final, dest)
    if getattr(final, 'gp', None):
        kwargs['global_pool'] = final.gp
    problem = fit_problem(run, final.model, kwargs, {'num_classes': '--num-classes'})
    if problem and run.arch and final.model != run.arch:
        problem += f' (the run trained {run.arch}: drop --model, or add --no-run-args to take nothing from the run)'
    if problem:
        raise RunError(problem)
    classes = _class_check(run, final, kwargs)
    if classes.problem:
        raise RunError(classes.problem)
    return ValidateFromRun(result.args + classes.args, result.taken + classes.notes, result.overrides)


def _class_check(run: RunSettings, final: argparse.Namespace, kwargs: Dict[str, Any]) -> ClassCheck:
    """The classes of validate.py's folder against the run's (:mod:`timm_ext.launch.run_classes`)."""
    from timm_ext.launch.input_size import meta_model

    num_classes = getattr(final, 'num_classes', None)
    if num_classes is None:
        model = meta_model(final.model, kwargs)
        num_classes = getattr(model, 'num_classes', None)
    if not isinstance(num_classes, int) or num_classes < 1:
        return ClassCheck()
    return class_check(run.args, final, num_classes, run.checkpoint)


def _without_option(argv: List[str], option: str) -> List[str]:
    out, skip = [], False
    for tok in argv:
        if skip:
            skip = False
        elif tok == option:
            skip = True
        elif not tok.startswith(option + '='):
            out.append(tok)
    return out


def validate_args_from_run(
        parser: argparse.ArgumentParser,
        argv: Sequence[str],
        run: RunSettings,
) -> ValidateFromRun:
    """validate.py's ``argv`` with what ``run`` recorded added where the user gave nothing: the model and its
    arguments, the evaluation's preprocessing (size, crop, interpolation, mean/std), the class count, AMP,
    the data and the device. ``--use-train-size`` (train.py evaluates at the training size) and ``--use-ema``
    (train.py's top-1 is the EMA's when it kept one) too. Raises RunError for a model that does not fit the
    checkpoint."""
    parsed = parser.parse_known_args(list(argv))[0]
    given = _given(parser, argv, parsed)
    flags = _flags(parser)
    train = run.args
    where = f'{run.checkpoint.parent.name}/{run.checkpoint.name}' if run.source == run.checkpoint.name else \
        f'{run.checkpoint.parent.name}/{run.source}'
    added: List[str] = []
    taken: List[str] = []
    overrides: List[str] = []

    def flag(dest: str) -> str:
        return max(flags[dest].option_strings, key=len)

    def add(dest: str, values: List[str], shown: str) -> None:
        added.extend([flag(dest), *values])
        taken.append(f'{flag(dest)} {shown}'.rstrip())

    if run.arch:
        if 'model' not in given:
            add('model', [run.arch], run.arch)
        elif parsed.model != run.arch:
            overrides.append(f'--model {parsed.model} is not the run\'s {run.arch}; the run\'s other settings are '
                             f'taken all the same (--no-run-args takes none)')
    for dest, train_dest, write, changes_result in _FROM_TRAIN:
        value = train.get(train_dest)
        if dest not in flags or not _recorded(value) or (dest == 'amp_dtype' and not train.get('amp')):
            continue
        if dest not in given:
            if write(value) == write(flags[dest].default) if _recorded(flags[dest].default) else False:
                continue  # validate.py's default is the run's value already
            add(dest, write(value), '' if isinstance(flags[dest], argparse._StoreTrueAction) else _show(value))
        elif changes_result and _show(getattr(parsed, dest)) != _show(value):
            overrides.append(f'{flag(dest)} {_show(getattr(parsed, dest))} differs from the '
                             f'run\'s {_show(value)}: the top-1 will not be the one train.py printed')
    if 'use_train_size' in flags and 'use_train_size' not in given:
        add('use_train_size', [], '')
    ema = train.get('model_ema') and not train.get('model_ema_force_cpu') and run.has_ema
    if ema and 'use_ema' in flags and 'use_ema' not in given:
        add('use_ema', [], '')
    taken_line = f'from {where}: ' + ', '.join(taken) if taken else ''
    return ValidateFromRun(list(argv) + added, [taken_line] if taken_line else [], overrides)


def fit_problem(run: RunSettings, model_name: str, model_kwargs: Dict[str, Any],
                flag_of: Dict[str, str]) -> Optional[str]:
    """One line when ``model_name(**model_kwargs)`` cannot take the checkpoint's weights (built on the meta
    device: nothing is allocated), naming the flag to drop or set; None when it fits."""
    import timm
    import torch

    import timm_ext.models  # noqa: F401 (registers the timm-ext architectures)

    if not timm.is_model(model_name):
        return None  # the model checks name an unknown model
    try:
        with torch.device('meta'):
            model = timm.create_model(model_name, **model_kwargs)
    except Exception as e:  # bad kwargs: validate.py would fail the same way
        return f'{model_name}({_show(model_kwargs)}) cannot be built: {type(e).__name__}: ' + \
            (str(e).splitlines() or [''])[0]
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    ckpt = run.state_shapes
    for key, shape in shapes.items():
        if key in ckpt and ckpt[key] != shape:
            classifier = model.pretrained_cfg.get('classifier')
            heads = classifier if isinstance(classifier, (list, tuple)) else [classifier]
            if any(h and key == f'{h}.weight' for h in heads) and 'num_classes' in flag_of:
                return (f'{flag_of["num_classes"]} {model_kwargs.get("num_classes")} does not fit {run.checkpoint}: '
                        f'{key} is {ckpt[key]} there, {shape} in the model: the run has {ckpt[key][0]} classes '
                        f'(drop {flag_of["num_classes"]})')
            return f'{run.checkpoint} does not fit {model_name}: {key} is {ckpt[key]} there, {shape} in the model'
    missing = [k for k in shapes if k not in ckpt]
    unexpected = [k for k in ckpt if k not in shapes]
    if missing or unexpected:
        first = f'{len(missing)} model keys missing (first: {missing[0]})' if missing else \
            f'{len(unexpected)} keys the model does not have (first: {unexpected[0]})'
        return f'{run.checkpoint} does not fit {model_name}: {first}; is it a checkpoint of {model_name}?'
    return None
