"""What train and validate share: find timm's script, report notes, run the child process."""
import shlex
import signal
import subprocess
import sys
from typing import List, Mapping, Optional

from timm_ext.cli._errors import CliError
from timm_ext.launch import build_command
from timm_ext.launch.timm_scripts import LATER_RELEASE, TimmScript, first_time_in_cache


def resolve_script(name: str, path: Optional[str], allow_unverified: bool) -> TimmScript:
    """timm's ``name`` for the installed timm; a problem becomes a one-line CliError, notes go to stderr."""
    try:
        script = build_command.resolve_script(name, path, allow_unverified)
    except build_command.TrainConfigError as e:
        raise CliError(str(e)) from None
    for note in script.notes:
        if not note.endswith(LATER_RELEASE) or first_time_in_cache(note):
            print(f'timm-ext: note: {note}', file=sys.stderr)
    return script


def run_child(cmd: List[str], dry_run: bool = False, env: Optional[Mapping[str, str]] = None) -> int:
    """Run ``cmd`` (or only print it) with ``env`` added to its environment; its exit code, 128 + N when a signal N
    ended it."""
    line = shlex.join(cmd)
    if dry_run:
        print(line)
        return 0
    print(f'timm-ext: running {line}', file=sys.stderr, flush=True)
    process = subprocess.Popen(cmd, env=dict(build_command.child_env(), **(env or {})))
    try:
        code = process.wait()
    except KeyboardInterrupt:
        _stop_cleanly(process)
        raise
    return code if code >= 0 else 128 - code


def _stop_cleanly(process: subprocess.Popen) -> None:
    """Ctrl-C: the terminal sent SIGINT to the child as well; give it time to stop by itself (train.py ends its
    epoch loop and keeps its checkpoints), pass SIGINT on if it did not get one, and end it only as a last resort."""
    try:
        process.wait(timeout=2)
        return
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=_GRACE_S)
    except subprocess.TimeoutExpired:
        process.terminate()
        process.wait()


_GRACE_S = 60
