"""Whether the model train.py will build takes the images train.py will feed it, checked before anything is built.

A ViT is built for one size: ``--img-size 32`` for a ViT built at 224 px passes every other check, then train.py
builds the model and the data and stops at its first batch (``AssertionError: Input height (32) doesn't match model
(224)``). The model is built here as train.py builds it, on the meta device (no memory, no weights read), the size
taken as train.py takes it (``resolve_data_config``), and one meta forward tells; each fix the line names is built
and run the same way first, so it names only fixes that work. Called by
:func:`timm_ext.launch.command_checks.check_train_command`.
"""
import argparse
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

__all__ = ['input_size_problems', 'meta_model', 'train_model_kwargs']

# A meta build and forward take about 0.3 s on a CPU (each op through torch's Python reference kernels); the checks
# of one command that build the same model (the size check, the class count), or many commands of one model (a
# recipe at its paper's batch and on a laptop), build and run it once while it is among the last few built. Meta
# models hold no memory, only their modules.
_BUILT: Dict[Tuple[str, str], Any] = {}
_KEEP_BUILT = 8
_FORWARD_ERRORS: 'weakref.WeakKeyDictionary[Any, Dict[Tuple[int, ...], Optional[str]]]' = weakref.WeakKeyDictionary()


def meta_model(model: str, kwargs: Dict[str, Any]) -> Any:
    """``timm.create_model(model, **kwargs)`` on the meta device, in eval mode (nothing allocated, no weights read);
    None when it cannot be built: an unknown model or bad kwargs, which train.py reports itself. The last few built
    are kept and given again for the same name and kwargs."""
    key = (model, repr(sorted(kwargs.items())))
    if key not in _BUILT:
        while len(_BUILT) >= _KEEP_BUILT:
            _BUILT.pop(next(iter(_BUILT)))
        _BUILT[key] = _build_meta_model(model, kwargs)
    return _BUILT[key]


def _build_meta_model(model: str, kwargs: Dict[str, Any]) -> Any:
    import timm
    import torch

    import timm_ext.models  # noqa: F401  (registers timm-ext's models)
    try:
        with torch.device('meta'), warnings.catch_warnings():
            warnings.simplefilter('ignore')
            return timm.create_model(model, pretrained=False, **kwargs).eval()
    except Exception:  # whatever the build raises, train.py raises it too, in its own words
        return None


def _forward_error(model: Any, size: Tuple[int, ...]) -> Optional[str]:
    """Why ``model`` (on the meta device) cannot run a batch of one ``size`` (C, H, W) image, in one line (the
    error's type alone when its text is long); None when it can. Run once per model and size."""
    errors = _FORWARD_ERRORS.setdefault(model, {})
    if size not in errors:
        errors[size] = _run_forward(model, size)
    return errors[size]


def _run_forward(model: Any, size: Tuple[int, ...]) -> Optional[str]:
    import torch

    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter('ignore')
            model(torch.empty((1, *size), device='meta'))
    except Exception as e:
        text = (str(e).strip().splitlines() or [''])[0]
        return f'{type(e).__name__}: {text}' if text and len(text) <= 160 else type(e).__name__
    return None


def train_model_kwargs(args: argparse.Namespace) -> Optional[Dict[str, Any]]:
    """What train.py gives ``timm.create_model`` beside the weights (``pretrained``, ``checkpoint_path``); None when
    ``--model-kwargs`` repeats one of them (train.py's TypeError)."""
    in_chans = args.in_chans if getattr(args, 'in_chans', None) is not None else (
        args.input_size[0] if getattr(args, 'input_size', None) else 3)
    own = {'in_chans': in_chans}
    for key, dest in (('num_classes', 'num_classes'), ('drop_rate', 'drop'), ('drop_path_rate', 'drop_path'),
                      ('drop_block_rate', 'drop_block'), ('global_pool', 'gp'), ('bn_momentum', 'bn_momentum'),
                      ('bn_eps', 'bn_eps'), ('scriptable', 'torchscript')):
        own[key] = getattr(args, dest, None)
    model_kwargs = args.model_kwargs or {}
    return None if set(own) & set(model_kwargs) else {**own, **model_kwargs}


def input_size_problems(args: argparse.Namespace, config: Dict[str, Any]) -> List[str]:
    """An input size the model cannot take: train.py builds the model and the data, then stops at its first batch
    (a ViT built for 224 px: ``Input height (32) doesn't match model (224)``). The model is built as train.py builds
    it on the meta device, the size taken as train.py takes it (``resolve_data_config``: ``--input-size``,
    ``--img-size``, else the model's pretrained cfg) and one forward tells; the fixes named are tried the same way.
    A model that fails at its own size too (an op without a meta kernel) is left to train.py, and so is one built as
    registered and fed its own pretrained cfg's size (no size, no ``model_kwargs``: the common command pays nothing)."""
    kwargs = train_model_kwargs(args)
    if getattr(args, 'naflex_loader', False) or not isinstance(args.model, str) or kwargs is None:
        return []
    if any(c in args.model for c in ('/', '\\', ':')):  # hf-hub:, local-dir:, paths: read by timm, not here
        return []
    if args.img_size is None and args.input_size is None and not args.model_kwargs:
        return []
    model = meta_model(args.model, kwargs)
    if model is None:
        return []
    from timm.data import resolve_data_config

    try:
        size = tuple(int(v) for v in resolve_data_config(vars(args), model=model)['input_size'])
    except Exception:  # a size train.py itself asserts on
        return []
    error = _forward_error(model, size) if len(size) == 3 else None
    own = _own_size(model, kwargs, size) if error else None
    if own is None:
        return []
    name, shown = args.model, 'x'.join(map(str, size[1:]))
    own_shown, own_flag = 'x'.join(map(str, own[1:])), _size_flag(own, args.input_size is not None)
    where = f'train.py would stop at its first batch: {error}'
    if args.input_size is None and args.img_size is None:
        built = f' (--model-kwargs {_kwargs_text(args.model_kwargs)})' if args.model_kwargs else ''
        return [f'no --img-size or --input-size, so train.py feeds {name} {shown} images (its pretrained cfg\'s '
                f'input_size), but the model{built} is built for {own_shown} and does not take them ({where}): '
                f'add {own_flag}']
    if args.input_size is not None:
        given = ' '.join(map(str, args.input_size))
        what = f'input_size {given} of the recipe' if config.get('input_size') == args.input_size else \
            f'--input-size {given}'
    else:
        what = f'img_size {args.img_size} of the recipe' if config.get('img_size') == args.img_size else \
            f'--img-size {args.img_size}'
    fixes = _size_fixes(args, kwargs, size)
    return [f'{what}: {name} does not take {shown} images, it is built for {own_shown} ({where}): '
            f'{"add " + fixes + ", or " if fixes else ""}train at its own size, {own_flag}']


def _own_size(model: Any, kwargs: Dict[str, Any], size: Tuple[int, ...]) -> Optional[Tuple[int, ...]]:
    """The size the model is built for (its ``img_size`` in ``kwargs``, else its pretrained cfg's), if it takes it:
    None when it runs at neither, so the failure is not the size's."""
    candidates = []
    img_size = kwargs.get('img_size')
    if isinstance(img_size, int) or (isinstance(img_size, (list, tuple)) and len(img_size) == 2):
        candidates.append((size[0], *((img_size, img_size) if isinstance(img_size, int) else img_size)))
    cfg_size = (getattr(model, 'pretrained_cfg', None) or {}).get('input_size')
    if isinstance(cfg_size, (list, tuple)) and len(cfg_size) == 3:
        candidates.append((size[0], *cfg_size[1:]))
    for candidate in dict.fromkeys(tuple(int(v) for v in c) for c in candidates):
        if candidate != size and _forward_error(model, candidate) is None:
            return candidate
    return None


def _size_fixes(args: argparse.Namespace, kwargs: Dict[str, Any], size: Tuple[int, ...]) -> str:
    """The ``--model-kwargs`` (the user's own kept) that make the model take ``size``: ``img_size=``, and
    ``dynamic_img_size=True`` where the model has it; each is built and run on the meta device first, and only those
    that run are named ('' when none does)."""
    height, width = size[1:]
    user = {k: v for k, v in (args.model_kwargs or {}).items() if k not in ('img_size', 'dynamic_img_size')}
    found = []
    for change in ({'img_size': height if height == width else (height, width)}, {'dynamic_img_size': True}):
        model = meta_model(args.model, {**kwargs, **change})
        if model is not None and _forward_error(model, size) is None:
            found.append(_kwargs_text({**user, **change}))
    if not found:
        return ''
    return f'--model-kwargs {found[0]}' + (f' (or {found[1]})' if len(found) > 1 else '')


def _size_flag(size: Tuple[int, ...], as_input_size: bool) -> str:
    """``--img-size 224``, or ``--input-size 3 224 160`` for a size that is not square or was given that way."""
    if as_input_size or size[1] != size[2]:
        return f'--input-size {" ".join(map(str, size))}'
    return f'--img-size {size[1]}'


def _kwargs_text(kwargs: Dict[str, Any]) -> str:
    """``key=value`` words timm's ParseKwargs reads back as ``kwargs`` (no spaces inside a value)."""
    return ' '.join(f'{k}={v if isinstance(v, str) else repr(v).replace(" ", "")}' for k, v in kwargs.items())
