"""One way for tests to run the ``timm-ext`` command in-process and read what it printed."""
from typing import Tuple

from timm_ext.cli import main


def run_cli(capsys, *argv) -> Tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``timm-ext ARGV``; argparse's own exits (``--help``, usage) included."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err
