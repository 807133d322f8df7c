"""Patches that make SAM work in timm's train.py before the task API (timm 1.0.15 ... 1.0.22).

Those scripts load plugins (``--device-modules``) but step the optimizer once per update with no
way to re-run the forward pass, so SAM has no second pass. ``patches/`` holds one small unified
diff per distinct script: when the optimizer has SAM's ``first_step``/``second_step`` contract,
the patched loop keeps train.py's own first pass at w and re-runs forward and backward of the
update's micro-batches at w + e (same autocast, loss scaling, dropout masks; BatchNorm statistics
of the first pass kept). Any other optimizer takes train.py's original code path.

``patches/index.tsv`` ties each tag to the sha256 of its train.py, the diff, and the sha256 of
the patched result. :func:`patch_script` finds the diff by the input's hash, applies it in pure
Python (every context and removed line verified, no fuzz), checks the result's hash, and writes
a new file: it never writes over its input nor over an existing file.
"""
import csv
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from timm_ext._resources import packaged_dir
from timm_ext.launch.release_table import SCRIPT_NAMES, sha256_of, tags_of

__all__ = [
    'ScriptPatch', 'apply_unified_diff', 'find_patch', 'load_patch_index', 'patch_script', 'patches_dir',
    'supported_tags',
]

INDEX_NAME = 'index.tsv'
_INDEX_COLUMNS = ('tag', 'sha256_in', 'patch', 'sha256_out')
_HUNK_RE = re.compile(r'^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@')

PathLike = Union[str, Path]


@dataclass(frozen=True)
class ScriptPatch:
    """One diff and the train.py it applies to (several tags can share one identical script)."""
    tags: Tuple[str, ...]
    sha256_in: str
    patch: str
    sha256_out: str

    @property
    def label(self) -> str:
        return ', '.join(self.tags)


def patches_dir() -> Path:
    """The folder holding ``index.tsv`` and the diffs: ``timm_ext/_patches`` in a wheel, ``patches/`` in a clone."""
    return packaged_dir('patches')


@lru_cache(maxsize=None)
def _load_index(folder: Path) -> Tuple[ScriptPatch, ...]:
    rows: Dict[str, List[Dict[str, str]]] = {}
    with open(folder / INDEX_NAME, newline='') as f:
        reader = csv.DictReader(f, delimiter='\t')
        if tuple(reader.fieldnames or ()) != _INDEX_COLUMNS:
            raise ValueError(f'{folder / INDEX_NAME}: columns {reader.fieldnames}, expected {list(_INDEX_COLUMNS)}')
        for row in reader:
            rows.setdefault(row['sha256_in'], []).append(row)
    out = []
    for sha_in, group in rows.items():
        if len({(r['patch'], r['sha256_out']) for r in group}) != 1:
            raise ValueError(f'{folder / INDEX_NAME}: tags {[r["tag"] for r in group]} share sha256 {sha_in} '
                             f'but not one patch and result')
        out.append(ScriptPatch(tuple(r['tag'] for r in group), sha_in, group[0]['patch'], group[0]['sha256_out']))
    return tuple(out)


def load_patch_index(folder: Optional[PathLike] = None) -> List[ScriptPatch]:
    """Every patch of ``index.tsv``, one entry per distinct input script."""
    return list(_load_index(Path(folder) if folder is not None else patches_dir()))


def find_patch(sha256: str, folder: Optional[PathLike] = None) -> Optional[ScriptPatch]:
    """The patch for the train.py whose sha256 is ``sha256``, or None."""
    sha256 = sha256.lower()
    return next((p for p in load_patch_index(folder) if p.sha256_in == sha256), None)


def supported_tags(folder: Optional[PathLike] = None) -> List[str]:
    """The timm tags whose train.py has a patch (oldest first)."""
    return [tag for p in load_patch_index(folder) for tag in p.tags]


def _lines(text: str) -> List[str]:
    """Lines with their ``\n`` (split on ``\n`` only, as diff does; not on form feeds and the like)."""
    parts = text.split('\n')
    return [part + '\n' for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _parse_hunks(diff: str) -> List[Tuple[int, List[str], List[str]]]:
    """(old start line, old lines, new lines) per hunk of a one-file unified diff."""
    lines = _lines(diff)
    idx = 0
    while idx < len(lines) and not lines[idx].startswith('--- '):
        idx += 1
    if idx + 1 >= len(lines) or not lines[idx + 1].startswith('+++ '):
        raise ValueError('not a unified diff: no "--- " / "+++ " header')
    idx += 2
    hunks = []
    while idx < len(lines):
        match = _HUNK_RE.match(lines[idx])
        if match is None:
            if lines[idx].startswith('--- '):
                raise ValueError('the diff changes more than one file')
            raise ValueError(f'unexpected line {idx + 1} of the diff: {lines[idx].rstrip()!r}')
        old_start, old_len = int(match.group(1)), int(match.group(2) or 1)
        new_len = int(match.group(4) or 1)
        old: List[str] = []
        new: List[str] = []
        idx += 1
        while idx < len(lines) and (len(old) < old_len or len(new) < new_len or lines[idx].startswith('\\')):
            line = lines[idx]
            if line.startswith('@@'):
                break
            tag, body = line[:1], line[1:]
            if tag == ' ':
                old.append(body)
                new.append(body)
            elif tag == '-':
                old.append(body)
            elif tag == '+':
                new.append(body)
            elif tag == '\\':  # "\ No newline at end of file" applies to the line before it
                prev = lines[idx - 1][:1]
                for side in ((old,) if prev == '-' else (new,) if prev == '+' else (old, new)):
                    side[-1] = side[-1][:-1] if side[-1].endswith('\n') else side[-1]
            else:
                raise ValueError(f'unexpected line {idx + 1} in a hunk of the diff: {line.rstrip()!r}')
            idx += 1
        if len(old) != old_len or len(new) != new_len:
            raise ValueError(
                f'hunk at line {old_start} has {len(old)}/{len(new)} lines, header says {old_len}/{new_len}')
        hunks.append((old_start - 1 if old_len else old_start, old, new))
    if not hunks:
        raise ValueError('the diff has no hunk')
    return hunks


def apply_unified_diff(text: str, diff: str) -> str:
    """Apply a one-file unified diff exactly: each hunk at its stated line, every context and removed
    line equal to the text's (no offset, no fuzz), hunks in order. Raises ValueError otherwise."""
    src = _lines(text)
    out: List[str] = []
    pos = 0
    for start, old, new in _parse_hunks(diff):
        if start < pos:
            raise ValueError(f'hunk at line {start + 1} overlaps the previous one')
        if src[start:start + len(old)] != old:
            got = next((i for i, (a, b) in enumerate(zip(src[start:], old)) if a != b), len(src) - start)
            raise ValueError(f'the diff does not match the file at line {start + got + 1}')
        out.extend(src[pos:start])
        out.extend(new)
        pos = start + len(old)
    out.extend(src[pos:])
    return ''.join(out)


def _known_script(sha256: str) -> Optional[str]:
    """What a timm script that needs no patch is, from timm-ext's table of timm scripts (None if not there)."""
    for name in SCRIPT_NAMES:
        tags = tags_of(sha256, name)
        if tags:
            return f'timm\'s {name} of {", ".join(tags)}'
    return None


def _unknown_file_error(src: Path, sha256: str, patches: List[ScriptPatch]) -> ValueError:
    done = next((p for p in patches if p.sha256_out == sha256), None)
    if done is not None:
        return ValueError(f'{src} is already patched by timm-ext (train.py of timm {done.label}); use it as it is')
    tags = [tag for p in patches for tag in p.tags]
    known = _known_script(sha256)
    what = f'{known}, which needs no patch' if known else 'not a train.py timm-ext can patch'
    return ValueError(f'{src} (sha256 {sha256}) is {what}; supported: the train.py of timm {tags[0]} ... {tags[-1]} '
                      f'(timm >= 1.0.23 runs SAM in its own train.py)')


def patch_script(src: PathLike, dst: PathLike) -> str:
    """Write the patched copy of timm's train.py ``src`` to the new file ``dst``.

    The script is recognised by its sha256 (an unknown or edited file is refused), the diff is
    applied exactly and the result must have the recorded sha256. ``dst`` must not be ``src``;
    an existing ``dst`` is never overwritten (one already holding the patched script is accepted
    as it is). Returns the timm tag(s) of the script, e.g. ``'v1.0.20, v1.0.21, v1.0.22'``.
    """
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise ValueError(f'{src} is not a file: give the path of timm\'s train.py')
    if dst.resolve() == src.resolve() or (dst.exists() and dst.samefile(src)):
        raise ValueError(f'the output {dst} is the input itself: give another path (the input is never changed)')
    data = src.read_bytes()
    sha_in = sha256_of(data)
    folder = patches_dir()
    patch = find_patch(sha_in, folder)
    if patch is None:
        raise _unknown_file_error(src, sha_in, load_patch_index(folder))
    if dst.exists():
        if dst.is_file() and sha256_of(dst) == patch.sha256_out:
            return patch.label
        raise ValueError(f'{dst} already exists and is not the patched script: remove it or choose another output path')
    diff = (folder / patch.patch).read_text(encoding='utf-8')
    try:
        result = apply_unified_diff(data.decode('utf-8'), diff).encode('utf-8')
    except ValueError as e:
        raise ValueError(f'{patch.patch} does not apply to {src}: {e}') from None
    sha_out = sha256_of(result)
    if sha_out != patch.sha256_out:
        raise ValueError(f'{patch.patch} applied to {src} gives sha256 {sha_out}, expected {patch.sha256_out}')
    with open(dst, 'xb') as f:  # exclusive creation: never replaces a file that appeared meanwhile
        f.write(result)
    return patch.label
