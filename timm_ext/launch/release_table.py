"""The sha256 table of timm releases' ``train.py`` and ``validate.py`` (``timm_ext/_data/timm_scripts.tsv``).

One row per release, computed from the release tags of timm's repository: the scripts' digests and what
the release offers (timm's task API, ``--device-modules``). The finder verifies files against it and the
patcher names the script it was given.
"""
import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Union

from packaging.version import Version

__all__ = ['SCRIPT_NAMES', 'ScriptRelease', 'TABLE_PATH', 'check_name', 'release_table', 'sha256_of', 'tags_of']

SCRIPT_NAMES = ('train.py', 'validate.py')
TABLE_PATH = Path(__file__).resolve().parents[1] / '_data' / 'timm_scripts.tsv'


@dataclass(frozen=True)
class ScriptRelease:
    """One row of the table: the sha256 of a timm release's scripts and what the release offers."""
    tag: str
    train_sha256: str
    validate_sha256: str
    has_task_api: bool
    has_device_modules: bool

    def sha256(self, name: str) -> str:
        return self.train_sha256 if name == 'train.py' else self.validate_sha256


@lru_cache(maxsize=None)
def release_table() -> Dict[str, ScriptRelease]:
    """The shipped sha256 table, oldest release first."""
    rows = {}
    lines = TABLE_PATH.read_text().splitlines()
    for line in lines[1:]:
        if not line.strip():
            continue
        tag, train_sha, validate_sha, task_api, device_modules = line.split('\t')
        rows[tag] = ScriptRelease(tag, train_sha, validate_sha, task_api == 'yes', device_modules == 'yes')
    return dict(sorted(rows.items(), key=lambda kv: Version(kv[0][1:])))


def check_name(name: str) -> None:
    """``name`` is one of timm's scripts (a programming error otherwise: ValueError)."""
    if name not in SCRIPT_NAMES:
        raise ValueError(f'Unknown timm script {name!r}; one of: {", ".join(SCRIPT_NAMES)}')


def tags_of(sha256: str, name: str = 'train.py') -> List[str]:
    """Every release whose ``name`` has this digest (a script often stays the same over several releases)."""
    check_name(name)
    return [tag for tag, row in release_table().items() if row.sha256(name) == sha256]


def sha256_of(source: Union[str, Path, bytes]) -> str:
    """The hex sha256 of a file (a path) or of ``bytes``."""
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    return hashlib.sha256(data).hexdigest()
