"""What train and validate share: find timm's script, report notes, run the child process."""
import shlex
import subprocess
import sys
from typing import List, Optional

from timm_ext.cli._errors import CliError
from timm_ext.launch import commands
from timm_ext.launch.find import TimmScript


def resolve_script(name: str, path: Optional[str], allow_unverified: bool) -> TimmScript:
    """timm's ``name`` for the installed timm; a problem becomes a one-line CliError, notes go to stderr."""
    try:
        script = commands.resolve_script(name, path, allow_unverified)
    except commands.TrainConfigError as e:
        raise CliError(str(e)) from None
    for note in script.notes:
        print(f'timm-ext: note: {note}', file=sys.stderr)
    return script


def run_child(cmd: List[str], dry_run: bool = False) -> int:
    """Run ``cmd`` (or only print it); its exit code, 128 + N when a signal N ended it."""
    line = shlex.join(cmd)
    if dry_run:
        print(line)
        return 0
    print(f'timm-ext: running {line}', file=sys.stderr, flush=True)
    code = subprocess.run(cmd, env=commands.child_env()).returncode
    return code if code >= 0 else 128 - code
