"""timm's own ``train.py`` and ``validate.py`` for the installed timm: found, verified, cached, downloaded.

No pip package ships these scripts (timm's wheel and sdist hold only the ``timm`` package), so
timm-ext finds them in this order:

1. an explicit path (``timm-ext train --timm-train PATH``, ``timm-ext validate --timm-validate PATH``);
2. ``$TIMM_EXT_TIMM_TRAIN``: timm's ``train.py`` or the folder that holds it (``validate.py`` is
   taken from the same folder);
3. the cache, ``$TIMM_EXT_CACHE/timm-train/<tag>/`` (default ``~/.cache/timm-ext/timm-train/<tag>/``);
4. a download of the file at the git tag ``v<timm version>`` of huggingface/pytorch-image-models,
   stored in that cache.

A verified file given by path or ``$TIMM_EXT_TIMM_TRAIN`` is copied into that cache when it is the
release the cache is searched for, so later commands find it without the path (and offline).
:func:`locate_script` says which file :func:`find_script` would use without downloading or writing.

Every file is checked against a table of sha256 digests shipped with timm-ext
(:mod:`timm_ext.launch.release_table`). A file that is no release's script is
refused unless ``allow_unverified``. A release's script runs on the same or a later timm (train.py of
v1.0.28 imports ``timm.task`` names that timm 1.0.27 lacks), so a newer script than the installed timm
is refused, an older one is used with a note. When the table has no row for the installed timm, the
newest release below it is used. ``train.py`` of a release without timm's task API (< v1.0.23) is
replaced by timm-ext's patched copy (:mod:`timm_ext.launch.patches`), so that SAM can re-run the forward.

:func:`load_script_parser` reads a script's argument parser without running it, and :func:`script_args` parses a
command line (and a recipe) the way the script will, so the checks before launch see what the script sees.
"""
import argparse
import contextlib
import copy
import io
import os
import re
import runpy
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from packaging.version import InvalidVersion, Version

from timm_ext._files import user_file_mode
from timm_ext.launch.release_table import check_name, release_table, sha256_of, tags_of

__all__ = [
    'ENV_CACHE', 'ENV_SCRIPT', 'SCRIPT_URL', 'ScriptError', 'ScriptLocation', 'TimmScript', 'cache_root',
    'ddp_passes_device_ids', 'fetch_url', 'find_script', 'load_script_parser', 'locate_script', 'script_args',
]

ENV_SCRIPT = 'TIMM_EXT_TIMM_TRAIN'
ENV_CACHE = 'TIMM_EXT_CACHE'
SCRIPT_URL = 'https://raw.githubusercontent.com/huggingface/pytorch-image-models/{tag}/{name}'
_OPTIONS = {'train.py': '--timm-train', 'validate.py': '--timm-validate'}


class ScriptError(RuntimeError):
    """timm's script cannot be provided: missing, unverifiable or wrong for the installed timm (one line)."""


@dataclass(frozen=True)
class TimmScript:
    """A resolved script. ``path`` is what to run (timm-ext's patched copy when ``patched``)."""
    name: str
    path: Path
    original: Path
    source: str
    sha256: str
    tag: Optional[str]
    notes: Tuple[str, ...] = field(default=())

    @property
    def patched(self) -> bool:
        return self.path != self.original


@dataclass(frozen=True)
class ScriptLocation:
    """Which file :func:`find_script` would use, found without downloading, caching or patching anything.

    ``script`` is the verified file, or None when it is not on this machine: then ``url`` is what
    find_script would download on first use and ``path`` where it would save it.
    """
    name: str
    source: str
    path: Path
    tag: Optional[str]
    script: Optional[TimmScript] = None
    url: Optional[str] = None
    notes: Tuple[str, ...] = field(default=())


# ends the notes that a release's script serves the installed, later timm: a fact of this installation,
# shown once per cache (:func:`first_time_in_cache`), not on every command
LATER_RELEASE = '(a release\'s script runs on later timm releases)'


def first_time_in_cache(note: str) -> bool:
    """True the first time this cache sees ``note`` (then recorded in ``notes-shown.txt`` there), and always when
    the cache cannot be written (the note is then shown each time rather than lost)."""
    record = cache_root() / 'notes-shown.txt'
    try:
        if record.is_file() and note in record.read_text(encoding='utf-8').splitlines():
            return False
        record.parent.mkdir(parents=True, exist_ok=True)
        with record.open('a', encoding='utf-8') as f:
            f.write(note + '\n')
    except OSError:
        return True
    return True


def cache_root() -> Path:
    """Where downloaded and patched scripts live: ``$TIMM_EXT_CACHE/timm-train`` (``~/.cache/timm-ext/timm-train``)."""
    return Path(os.environ.get(ENV_CACHE, Path.home() / '.cache' / 'timm-ext')).expanduser() / 'timm-train'


def fetch_url(url: str, timeout: float = 30.0) -> bytes:
    """The bytes at ``url`` (the one place timm-ext goes to the network for scripts; tests replace it)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def ddp_passes_device_ids(path: Union[str, Path]) -> bool:
    """True when the script hands ``device_ids=[device]`` to DistributedDataParallel unconditionally.

    torch refuses ``device_ids`` for a module on the CPU, so such a script cannot run DDP on CPU
    (every train.py from v1.0.15 to v1.0.28 does this; ``[device] if ... else None`` would not count).
    """
    return re.search(r'device_ids\s*=\s*\[\s*device\s*\]\s*[,)]', Path(path).read_text()) is not None


def load_script_parser(path: Union[str, Path]) -> argparse.ArgumentParser:
    """The module-level argparse ``parser`` of timm's train.py or validate.py, without running ``main()``.

    The script runs as a module named other than ``__main__``, so only its imports and argument
    definitions execute. Each call returns a fresh parser (callers may ``set_defaults`` on it).
    """
    try:
        namespace = runpy.run_path(str(path), run_name='timm_ext_script_probe')
    except Exception as e:  # e.g. an ImportError: the script needs another timm than the installed one
        raise ScriptError(f'cannot read the arguments of {path}: {type(e).__name__}: {e}') from None
    parser = namespace.get('parser')
    if not isinstance(parser, argparse.ArgumentParser):
        raise ScriptError(f'{path} defines no module-level argparse `parser`; is it timm\'s train.py or validate.py?')
    return parser


def script_args(
        parser: argparse.ArgumentParser, argv: Sequence[str], config: Optional[Dict[str, Any]] = None,
) -> Optional[argparse.Namespace]:
    """The namespace timm's script parses: ``set_defaults(**recipe)`` then ``parse_args(argv)``, as train.py's
    ``_parse_args`` does (string values converted by each argument's type). ``parser`` is left as it was (a copy
    is parsed); None when the script would reject ``argv`` (it prints its own usage error then)."""
    parser = copy.deepcopy(parser)
    if config:
        parser.set_defaults(**config)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(list(argv))
    except SystemExit:
        return None


def find_script(
        name: str = 'train.py',
        path: Optional[Union[str, Path]] = None,
        allow_unverified: bool = False,
        timm_version: Optional[str] = None,
        patch: bool = True,
        remember: bool = True,
) -> TimmScript:
    """Find timm's ``name`` for the installed timm (explicit path, env, cache, download) and verify it.

    ``timm_version`` defaults to the installed one. Raises ScriptError with one line that says why
    and what to do. With ``patch``, a train.py without the task API is replaced by the patched copy.
    With ``remember``, a file given by ``path`` or ``$TIMM_EXT_TIMM_TRAIN`` is copied into the cache
    (see :func:`_remembered`), so the next call finds it without either.
    """
    check_name(name)
    version = _installed_version(timm_version)
    location = locate_script(name, path, allow_unverified, str(version))
    if location.script is None:
        script = _downloaded(location, version, allow_unverified)
    elif remember and location.source != 'cache':
        script = _remembered(location.script, version)
    else:
        script = location.script
    return _with_task_api(script) if patch and name == 'train.py' else script


def locate_script(
        name: str = 'train.py',
        path: Optional[Union[str, Path]] = None,
        allow_unverified: bool = False,
        timm_version: Optional[str] = None,
) -> ScriptLocation:
    """Which ``name`` find_script would use (explicit path, env, cache), or what it would download.

    Touches neither the network nor the disk beyond reading the file; raises the same one-line
    ScriptError as find_script for a file it would refuse (``timm-ext doctor`` reports it).
    """
    check_name(name)
    version = _installed_version(timm_version)
    if path is not None or os.environ.get(ENV_SCRIPT):
        if path is not None:
            source = _OPTIONS[name]
            file = _in_folder(Path(path), name, source)
        else:
            source = ENV_SCRIPT
            file = _from_env(os.environ[ENV_SCRIPT], name)
        script = _verified(file, name, source, version, allow_unverified)
        return ScriptLocation(name, source, file, script.tag, script=script, notes=script.notes)
    tag, notes = _wanted_tag(version, allow_unverified)
    target = cache_root() / tag / name
    if target.is_file():
        script = _verified(target, name, 'cache', Version(tag[1:]), allow_unverified)
        script = replace(script, notes=notes + script.notes)
        return ScriptLocation(name, 'cache', target, tag, script=script, notes=script.notes)
    return ScriptLocation(name, 'download', target, tag, url=SCRIPT_URL.format(tag=tag, name=name), notes=notes)


def _installed_version(version: Optional[str]) -> Version:
    if version is None:
        import timm
        version = timm.__version__
    try:
        return Version(version)
    except InvalidVersion as e:
        raise ValueError(f'timm version {version!r} is not a version number') from e


def _in_folder(path: Path, name: str, source: str) -> Path:
    path = path.expanduser()
    if path.is_dir():
        path = path / name
    if not path.is_file():
        raise ScriptError(f'{source} {path}: no such file')
    return path


def _from_env(value: str, name: str) -> Path:
    """``$TIMM_EXT_TIMM_TRAIN`` names train.py or its folder; validate.py is looked up beside train.py."""
    path = Path(value).expanduser()
    if path.is_file() and name != 'train.py':
        path = path.parent
    return _in_folder(path, name, ENV_SCRIPT)


def _span(tags: List[str]) -> str:
    return tags[0] if len(tags) == 1 else f'{tags[0]}..{tags[-1]}'


def _known_range() -> str:
    return _span(list(release_table()))


def _verified(path: Path, name: str, source: str, version: Version, allow_unverified: bool) -> TimmScript:
    """Match the file's sha256 against the table and the installed timm; refuse what does not fit."""
    digest = sha256_of(path)
    tags = tags_of(digest, name)
    found = dict(name=name, path=path, original=path, source=source, sha256=digest)
    if not tags:
        other = 'validate.py' if name == 'train.py' else 'train.py'
        other_tags = tags_of(digest, other)
        if other_tags:
            what = f'this is {other} of {_span(other_tags)}, not {name}'
        else:
            what = (f'its sha256 {digest[:16]}... is not the {name} of any timm release timm-ext knows '
                    f'({_known_range()})')
        if allow_unverified:
            return TimmScript(tag=None, notes=(f'running an unverified {name} ({path}): {what}',), **found)
        raise ScriptError(f'{source} {path}: {what}; pass --allow-unverified to run it anyway')
    exact = f'v{version.public}'
    if exact in tags:
        return TimmScript(tag=exact, **found)
    older = [t for t in tags if Version(t[1:]) <= version]
    if older:
        note = f'using {name} of {older[-1]} with timm {version} {LATER_RELEASE}'
        return TimmScript(tag=older[-1], notes=(note,), **found)
    what = (f'this is {name} of {_span(tags)}, but timm {version} is installed; it needs timm >= {tags[0][1:]}: '
            f'upgrade timm or give the {name} of v{version.public}')
    if allow_unverified:
        return TimmScript(tag=tags[0], notes=(f'{source} {path}: {what}',), **found)
    raise ScriptError(f'{source} {path}: {what} (or pass --allow-unverified)')


def _wanted_tag(version: Version, allow_unverified: bool) -> Tuple[str, Tuple[str, ...]]:
    """The release whose script to take from the cache or download, and a note when it is not ``version``'s."""
    table = release_table()
    exact = f'v{version.public}'
    if exact in table:
        return exact, ()
    if allow_unverified and not (version.is_prerelease or version.is_devrelease):
        return exact, (f'timm-ext has no sha256 for timm {version}\'s scripts ({_known_range()}): '
                       f'using the unverified ones of {exact}',)
    older = [t for t in table if Version(t[1:]) <= version]
    if not older:
        raise ScriptError(
            f'timm {version} is older than every timm release whose scripts timm-ext knows ({_known_range()}; '
            f'{next(iter(table))} is the first with --device-modules): upgrade timm')
    return older[-1], (f'timm-ext has no sha256 for timm {version}\'s scripts (it knows {_known_range()}): '
                       f'using those of {older[-1]} {LATER_RELEASE}',)


def _downloaded(location: ScriptLocation, version: Version, allow_unverified: bool) -> TimmScript:
    """Download the file ``location`` names, check its sha256, and save it in the cache."""
    name, tag, url, target = location.name, location.tag, location.url, location.path
    try:
        data = fetch_url(url)
    except Exception as e:  # urllib's errors, timeouts, no network: all end in the same advice
        reason = str(getattr(e, 'reason', '') or e).strip() or type(e).__name__
        which = tag if tag == f'v{version.public}' else (
            f'{tag} (timm {version} is installed; {tag} is the newest release timm-ext has a sha256 for)')
        raise ScriptError(
            f'could not download {name} of timm {which} from {url} ({reason}); provide it in one of three other '
            f'ways: {_OPTIONS[name]} PATH, {ENV_SCRIPT}=PATH (timm\'s train.py or its folder), '
            f'or save it as {target}') from None
    expected = release_table().get(tag)
    digest = sha256_of(data)
    if expected is not None and digest != expected.sha256(name):
        raise ScriptError(
            f'the {name} downloaded from {url} has sha256 {digest[:16]}..., not timm-ext\'s '
            f'{expected.sha256(name)[:16]}... for {tag}; it was not saved')
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f'.{name}.', delete=False) as f:
        f.write(data)
    os.chmod(f.name, user_file_mode())  # a new file's mode, not the temporary file's 0600
    os.replace(f.name, target)
    script = _verified(target, name, 'download', Version(tag[1:]), allow_unverified)
    return replace(script, notes=location.notes + script.notes)


def _remembered(script: TimmScript, version: Version) -> TimmScript:
    """Copy a file given by path or env into the cache, where the next command without either looks.

    Only a verified release's script is copied, and only when it is the release the cache is searched
    for (an older release's file stored under its own tag would never be found). An existing file is
    never replaced: the copy is linked in place, which fails when another file got there first.
    """
    if script.tag is None or Version(script.tag[1:]) > version:  # unverified: accepted by --allow-unverified
        return script
    flag = '$' + ENV_SCRIPT if script.source == ENV_SCRIPT else script.source
    wanted, _ = _wanted_tag(version, allow_unverified=False)
    target = cache_root() / wanted / script.name
    if script.tag != wanted:
        note = (f'{script.name} of {script.tag} is not cached: without {flag}, timm {version} looks for the '
                f'{script.name} of {wanted} ({target})')
        return replace(script, notes=script.notes + (note,))
    data = script.original.read_bytes()
    if sha256_of(data) != script.sha256:
        note = f'{script.original} changed while it was read; it was not cached'
        return replace(script, notes=script.notes + (note,))
    try:
        if target.exists():
            return _existing(script, target, flag)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f'.{script.name}.', delete=False) as f:
            f.write(data)
        shutil.copymode(script.original, f.name)  # readable as the given file is, not the temporary file's 0600
        try:
            os.link(f.name, target)  # atomic, and refuses to replace a file another process wrote meanwhile
        except FileExistsError:
            return _existing(script, target, flag)
        except OSError:  # a file system without hard links: replace, which is atomic too
            os.replace(f.name, target)
        finally:
            Path(f.name).unlink(missing_ok=True)
    except OSError as e:
        note = f'could not cache {script.name} of {script.tag} as {target} ({e.strerror or e}); {flag} stays needed'
        return replace(script, notes=script.notes + (note,))
    note = f'cached {script.name} of {script.tag} as {target}: later commands find it there without {flag}'
    return replace(script, notes=script.notes + (note,))


def _existing(script: TimmScript, target: Path, flag: str) -> TimmScript:
    """The cache already holds ``target``: nothing to say when it is this file, a note when it is not."""
    if target.is_file() and sha256_of(target) == script.sha256:
        return script
    note = (f'did not cache {script.name} of {script.tag}: {target} already holds another file, left as it is '
            f'(later commands without {flag} use it; delete it to cache this one)')
    return replace(script, notes=script.notes + (note,))


def _with_task_api(script: TimmScript) -> TimmScript:
    """A train.py without timm's task API becomes timm-ext's patched copy, so SAM can re-run the forward."""
    row = release_table().get(script.tag) if script.tag else None
    if row is None or row.has_task_api:
        return script
    try:
        from timm_ext.launch.patches import patch_script
    except ImportError as e:
        raise ScriptError(f'train.py of {script.tag} has no task API and needs timm-ext\'s patch, '
                          f'but timm_ext.launch.patches cannot be imported ({e})') from None
    target = cache_root() / script.tag / 'train_patched.py'
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f'.train_patched.{os.getpid()}.py')  # complete files only replace the cached copy
    try:
        patch_script(script.original, tmp)
        os.replace(tmp, target)
    except ValueError as e:
        raise ScriptError(f'cannot patch train.py of {script.tag} ({script.original}): {e}') from None
    finally:
        tmp.unlink(missing_ok=True)
    note = f'train.py of {script.tag} has no task API: running timm-ext\'s patched copy {target}'
    return replace(script, path=target, notes=script.notes + (note,))
