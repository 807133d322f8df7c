"""``timm-ext convert CHECKPOINT OUTPUT --model NAME``: an official AlterNet checkpoint to timm-ext's layout."""
import argparse
import json
from pathlib import Path
from typing import Any, Dict, List

from timm.utils import ParseKwargs

from timm_ext.cli._errors import CliError
from timm_ext_cli.commands import COMMANDS


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'convert', help=COMMANDS['convert'],
        description='Convert a checkpoint of the official AlterNet code (xxxnell/how-do-vits-work: a state_dict or '
                    'its {"state_dict": ...} snapshot) to the state_dict of a timm-ext model, checked key by key '
                    'and shape by shape, and write it as safetensors. The checkpoint is read with '
                    'torch.load(weights_only=True): no arbitrary object is unpickled.')
    parser.add_argument('checkpoint', metavar='CHECKPOINT', help='the official checkpoint (.pth, .pth.tar)')
    parser.add_argument('output', metavar='OUTPUT', help='the file to write (.safetensors)')
    parser.add_argument('--model', required=True, metavar='NAME',
                        help='the timm-ext model the checkpoint was trained as (e.g. alternet_50_cifar)')
    parser.add_argument('--num-classes', type=int, metavar='N',
                        help='classes of the checkpoint\'s head (default: read from the checkpoint)')
    parser.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs, metavar='KEY=VALUE',
                        help='other arguments of the model (msa_blocks=(0,1,3,2) window_size=4 ...)')
    parser.add_argument('--force', action='store_true', help='overwrite OUTPUT if it exists')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    source, output = Path(args.checkpoint).expanduser(), Path(args.output).expanduser()
    if not source.is_file():
        raise CliError(f'checkpoint {args.checkpoint!r} does not exist')
    if output.suffix != '.safetensors':
        raise CliError(f'OUTPUT {args.output!r} must end with .safetensors')
    if output.exists() and output.resolve() == source.resolve():
        raise CliError('OUTPUT must not be the checkpoint itself')
    if output.exists() and not args.force:
        raise CliError(f'OUTPUT {args.output!r} exists; pass --force to overwrite it')
    import timm

    import timm_ext  # noqa: F401  (registers the models)
    from timm_ext.hub import save_safetensors
    from timm_ext.models import convert_official_alternet

    checkpoint = _load(source)
    kwargs = dict(args.model_kwargs)
    num_classes = args.num_classes if args.num_classes is not None else _head_classes(checkpoint)
    if num_classes is not None:
        kwargs['num_classes'] = num_classes
    try:
        model = timm.create_model(args.model, pretrained=False, **kwargs)
    except (RuntimeError, TypeError, ValueError) as e:
        raise CliError(f'cannot build --model {args.model} with {kwargs}: {e}') from None
    try:
        state_dict = convert_official_alternet(checkpoint, model)
    except ValueError as e:
        raise CliError(str(e)) from None
    model.load_state_dict(state_dict, strict=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    metadata = {'format': 'pt', 'architecture': args.model, 'model_args': json.dumps(kwargs, default=str)}
    save_safetensors({k: v.contiguous() for k, v in state_dict.items()}, output, metadata=metadata)
    print(f'wrote {output}: {len(state_dict)} tensors, {sum(v.numel() for v in state_dict.values()):,} values '
          f'for {args.model}({", ".join(f"{k}={v!r}" for k, v in kwargs.items())})')
    # the overlay's num_classes keeps timm from dropping a head whose size differs from the registered cfg's
    overlay = f'file={str(output)!r}' + (f', num_classes={num_classes}' if num_classes is not None else '')
    print(f'load it with timm.create_model({args.model!r}, pretrained=True, pretrained_cfg_overlay=dict({overlay})'
          f'{"".join(f", {k}={v!r}" for k, v in kwargs.items())})')
    return 0


def _load(path: Path) -> Dict[str, Any]:
    import torch
    try:
        checkpoint = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:  # not a torch file, or it needs unpickling of arbitrary objects
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CliError(f'cannot read {path} with torch.load(weights_only=True): {first}') from None
    if not isinstance(checkpoint, dict):
        raise CliError(f'{path} holds a {type(checkpoint).__name__}, not a state_dict')
    return checkpoint


def _head_classes(checkpoint: Dict[str, Any]) -> Any:
    """The official classifier's output count (``classifier.0.dense.weight``), None when absent."""
    state_dict = checkpoint.get('state_dict', checkpoint)
    for key, value in state_dict.items():
        if key.endswith('classifier.0.dense.weight') and hasattr(value, 'shape'):
            return int(value.shape[0])
    return None
