"""``timm-ext export --checkpoint PATH --out DIR [--model NAME]``: a train.py checkpoint to a hub folder."""
import argparse
from typing import Any, Dict, List

from timm.utils import ParseKwargs

from timm_ext.cli._errors import CliError
from timm_ext_cli.commands import COMMANDS


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'export', help=COMMANDS['export'],
        description='Write the weights of a train.py checkpoint (last.pth.tar, model_best.pth.tar; read with '
                    'torch.load(weights_only=True)) or of a safetensors file as a folder that '
                    'timm.create_model("hf-hub:ORG/NAME") and "local-dir:DIR" load: model.safetensors, config.json '
                    '(architecture, num_classes, model_args, pretrained_cfg) and a model card README.md. The '
                    'model and its arguments default to those train.py recorded in the checkpoint.')
    parser.add_argument('--checkpoint', required=True, metavar='PATH',
                        help='train.py checkpoint (.pth.tar) or weights (.safetensors, .pth)')
    parser.add_argument('--out', required=True, metavar='DIR', help='the folder to write (empty or absent)')
    parser.add_argument('--model', metavar='NAME',
                        help='the architecture (default: the one train.py recorded in the checkpoint)')
    parser.add_argument('--model-kwargs', nargs='*', default={}, action=ParseKwargs, metavar='KEY=VALUE',
                        help='arguments of timm.create_model (img_size=32 num_classes=100 ...), over those recorded '
                             'in the checkpoint')
    parser.add_argument('--ema', action='store_true', help='export the EMA weights (train.py --model-ema)')
    parser.add_argument('--recipe', metavar='NAME', help='the recipe it was trained with (for the model card)')
    parser.add_argument('--top1', type=float, metavar='X', help='the measured top-1 in %% (for the model card)')
    parser.add_argument('--train-command', metavar='TEXT', help='the training command (for the model card)')
    parser.add_argument('--repo-id', metavar='ORG/NAME', help='the repo it will be pushed to (for the model card)')
    parser.add_argument('--license', default='apache-2.0', metavar='ID', help='licence of the weights (apache-2.0)')
    parser.add_argument('--force', action='store_true',
                        help='write into a non-empty DIR: replace model.safetensors, config.json and README.md, '
                             'keep every other file')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    import timm

    from timm_ext.hub import CardInfo, HubError, export, load_checkpoint, load_weights

    try:
        checkpoint = load_checkpoint(args.checkpoint, use_ema=args.ema)
    except HubError as e:
        raise CliError(str(e)) from None
    name = args.model or checkpoint.arch
    if not name:
        raise CliError(f'{checkpoint.path} records no architecture: pass --model NAME')
    recorded = checkpoint.model_kwargs() if name == checkpoint.train_args.get('model', checkpoint.arch) else {}
    kwargs: Dict[str, Any] = dict(recorded, **args.model_kwargs)
    try:
        model = timm.create_model(name, pretrained=False, **kwargs)
    except Exception as e:
        raise CliError(f'cannot build --model {name} with {kwargs}: {e}') from None
    data_config = checkpoint.data_config()
    card = CardInfo(recipe=args.recipe, top1=args.top1, train_command=args.train_command,
                    train_args=checkpoint.train_args or None, repo_id=args.repo_id, license=args.license,
                    ema=checkpoint.ema, epoch=checkpoint.epoch)
    try:
        load_weights(model, checkpoint.state_dict, checkpoint.path)
        out = export(model, args.out, model_args=kwargs, data_config=data_config, card=card, overwrite=args.force)
    except HubError as e:
        raise CliError(str(e)) from None
    n = sum(v.numel() for v in checkpoint.state_dict.values())
    which = 'EMA weights' if checkpoint.ema else 'weights'
    print(f'wrote {out}: {name}({", ".join(f"{k}={v!r}" for k, v in kwargs.items())}), {which} of '
          f'{checkpoint.path.name}, {n:,} values')
    target = args.repo_id or 'ORG/NAME'
    print(f'check it: timm.create_model("local-dir:{out}", pretrained=True) after `import timm_ext`')
    print(f'publish it: timm-ext push {out} --repo-id {target}')
    return 0
