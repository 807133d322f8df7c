"""``python -m timm_ext.cli._child MODULES SCRIPT [ARGS...]``: import MODULES, then run SCRIPT as ``__main__``.

For timm's scripts that have no ``--device-modules`` (validate.py): timm-ext (and any other module
that registers models) is imported first, then the script runs unchanged with its own arguments.
"""
import importlib
import os
import runpy
import sys


def main() -> None:
    modules, script, *args = sys.argv[1:]
    for module in filter(None, modules.split(',')):
        importlib.import_module(module)
    if 'timm_ext' in modules.split(',') and os.path.basename(script).startswith('train'):
        # timm_ext was imported before train.py is __main__, so it could not see train.py: hook it now
        from timm_ext.launch.train_py_hooks import install_train_py_hooks
        install_train_py_hooks()
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` would have it
    runpy.run_path(script, run_name='__main__')


if __name__ == '__main__':
    main()
