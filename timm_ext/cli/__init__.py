"""The ``timm-ext`` command line: an argparse front end only.

Each subcommand is one small module of this package with two functions:

* ``add_parser(subparsers) -> argparse.ArgumentParser``: registers the subcommand and its options;
* ``run(args, extra) -> int``: does the work by calling the library (``timm_ext.launch``,
  ``timm_ext.recipes``, ...) and returns the exit code. ``extra`` holds the arguments argparse did
  not know; only subcommands whose module sets ``PASSTHROUGH = True`` (train, validate) accept them.

Exit codes: 0 ok, 2 usage or input error (one line on stderr, no traceback), the child's own code
for subcommands that run timm's scripts.
"""
import argparse
import importlib
import os
import sys
from typing import List, Optional

from timm_ext.cli._errors import CliError
from timm_ext_cli.commands import COMMANDS, top_level_parser

__all__ = ['CliError', 'build_parser', 'main']

SUBCOMMANDS = tuple(COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    parser = top_level_parser()  # the description, --version and the subcommands' help: timm_ext_cli.commands
    subparsers = parser.add_subparsers(dest='command', metavar='COMMAND')
    subparsers.required = True
    for name in SUBCOMMANDS:
        module = importlib.import_module(f'timm_ext.cli.{name}')
        sub = module.add_parser(subparsers)
        sub.set_defaults(_module=module)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``timm-ext`` console script and of ``python -m timm_ext``."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    module = args._module
    if extra and not getattr(module, 'PASSTHROUGH', False):
        parser.error(f'unrecognized arguments for {args.command!r}: {" ".join(extra)}')
    try:
        return int(module.run(args, extra) or 0)
    except CliError as e:
        for line in str(e).splitlines() or ['']:  # several problems: one line each
            print(f'timm-ext {args.command}: error: {line}', file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f'timm-ext {args.command}: interrupted', file=sys.stderr)
        return 130
    except BrokenPipeError:  # `timm-ext recipes list | head`: the reader left; no traceback, as for `cat`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python flushes stdout again at exit
        return 141
