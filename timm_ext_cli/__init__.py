"""The ``timm-ext`` command's entry point (``timm-ext = timm_ext_cli:main``): what needs no torch answers at once.

``timm-ext --help``, ``--version``, ``models [PATTERN] [--json]`` and ``recipes list [--names] [--wide]`` are
answered by :mod:`timm_ext_cli.commands` (standard library only); every other command goes to
:func:`timm_ext.cli.main`, which imports timm-ext (and torch). The package imports
:mod:`timm_ext_cli.commands`, never this module: only the entry points (this one, ``python -m timm_ext``) sit
above it.
"""
import os
import sys
from typing import List, Optional

from timm_ext_cli.commands import COMMANDS, print_models, print_recipe_list, top_level_parser, version

__all__ = ['main']


def _fast(argv: List[str]) -> Optional[int]:
    """The exit code of a command answered here, None for one that needs timm-ext."""
    if argv in (['-h'], ['--help']):
        parser = top_level_parser()
        sub = parser.add_subparsers(dest='command', metavar='COMMAND')
        for name, text in COMMANDS.items():
            sub.add_parser(name, help=text)
        parser.print_help()
        return 0
    if argv == ['--version']:
        print(f'timm-ext {version()}')
        return 0
    if argv[:1] == ['models']:
        rest = argv[1:]
        patterns = [a for a in rest if not a.startswith('-')]
        if set(rest) - set(patterns) <= {'--json'} and len(patterns) <= 1 and rest.count('--json') <= 1:
            return print_models(patterns[0] if patterns else None, '--json' in rest)
    if argv[:2] == ['recipes', 'list'] and set(argv[2:]) <= {'--names', '--wide'}:
        return print_recipe_list('--names' in argv, '--wide' in argv)
    return None


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``timm-ext`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = _fast(argv)
    except BrokenPipeError:  # `timm-ext recipes list | head`: the reader left; no traceback, as for `cat`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    if code is not None:
        return code
    from timm_ext.cli import main as full_main
    return full_main(argv)
