"""Where the tests find timm's real train.py and validate.py: the one reading of ``$TIMM_EXT_TIMM_TRAIN`` in the suite.

timm-ext reads the variable as the folder holding both scripts, or as train.py itself (validate.py then beside it:
``timm_ext.launch.timm_scripts``, README, docs/cli.md), and so does every test: ``.ci/run`` sets the folder, the
timm-release lanes set the file. Unset: ``../shared/timm-train/v1.0.28`` beside the repository.
"""
import os
from pathlib import Path

__all__ = ['ENV', 'GIVEN', 'SCRIPTS_DIR', 'TRAIN_PY', 'VALIDATE_PY', 'scripts_dir']

ENV = 'TIMM_EXT_TIMM_TRAIN'
DEFAULT = Path(__file__).resolve().parents[2] / 'shared' / 'timm-train' / 'v1.0.28'


def scripts_dir(value: str = '') -> Path:
    """The folder of timm's scripts that ``value`` (a folder, or a train.py in it) names; the default when empty.
    A path ending in ``.py`` is the script even when it is missing, so a skip names the file that was asked for."""
    if not value:
        return DEFAULT
    path = Path(value).expanduser()
    return path.parent if path.is_file() or (path.suffix == '.py' and not path.is_dir()) else path


GIVEN = bool(os.environ.get(ENV))  # read once, at import: fixtures (offline_scripts) clear it during a test
SCRIPTS_DIR = scripts_dir(os.environ.get(ENV, '')).resolve()
TRAIN_PY, VALIDATE_PY = SCRIPTS_DIR / 'train.py', SCRIPTS_DIR / 'validate.py'
