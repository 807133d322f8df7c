"""``timm-ext push DIR --repo-id ORG/NAME``: upload a folder made by ``timm-ext export`` to the Hugging Face Hub."""
import argparse
from typing import List

from timm_ext.cli._errors import CliError
from timm_ext_cli.commands import COMMANDS


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'push', help=COMMANDS['push'],
        description='Check the folder (it must load: config.json, model.safetensors only, shapes), create the model '
                    'repo if needed and upload the folder with huggingface_hub. The token is huggingface_hub\'s '
                    '(HF_TOKEN or `hf auth login`).')
    parser.add_argument('folder', metavar='DIR', help='the folder written by `timm-ext export`')
    parser.add_argument('--repo-id', required=True, metavar='ORG/NAME', help='the model repo to upload to')
    parser.add_argument('--private', action='store_true', help='create the repo as private (an existing repo keeps '
                                                               'its visibility)')
    parser.add_argument('--revision', metavar='BRANCH', help='upload to this branch (created when absent)')
    parser.add_argument('--message', metavar='TEXT', help='the commit message')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    from timm_ext.hub import HubError, push

    try:
        result = push(args.folder, args.repo_id, private=args.private, revision=args.revision,
                      commit_message=args.message)
    except HubError as e:
        raise CliError(str(e)) from None
    print(f'pushed {args.folder} to {result.repo_id} ({result.revision}): {result.commit_url or "done"}')
    print(f'load it: timm.create_model("hf-hub:{result.repo_id}", pretrained=True) after `import timm_ext`')
    if result.commit:
        print(f'pin it in a pretrained tag: hf_hub_id="{result.pinned_id}"')
    return 0
