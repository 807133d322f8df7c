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
release the cache is searched for, and so is the other script beside it when it is the same release's
(``timm-ext train --timm-train PATH`` once, and ``timm-ext validate`` finds validate.py), so later
commands find them without the path (and offline). :func:`locate_script` says which file
:func:`find_script` would use without downloading or writing; :func:`download_problems` whether a file
can be downloaded now (``timm-ext doctor``).

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
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from packaging.version import InvalidVersion, Version

from timm_ext._files import user_file_mode
from timm_ext.launch.release_table import check_name, release_table, sha256_of, tags_of

__all__ = [
    'ENV_CACHE', 'ENV_SCRIPT', 'PROBE_TIMEOUT_S', 'SCRIPT_URL', 'ScriptError', 'ScriptLocation', 'TimmScript',
    'cache_root', 'ddp_passes_device_ids', 'download_problems', 'fetch_url', 'find_script', 'load_script_parser',
    'locate_script', 'probe_url', 'script_args',
]

ENV_SCRIPT = 'TIMM_EXT_TIMM_TRAIN'
ENV_CACHE = 'TIMM_EXT_CACHE'
SCRIPT_URL = 'https://raw.githubusercontent.com/huggingface/pytorch-image-models/{tag}/{name}'
_OPTIONS = {'train.py': '--timm-train', 'validate.py': '--timm-validate'}
_BESIDE = {'train.py': 'validate.py', 'validate.py': 'train.py'}  # the script cached with a given one
_FETCH_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 4.0  # how long `timm-ext doctor` waits for the server, both scripts together


class ScriptError(RuntimeError):
    """timm's script cannot be provided: missing, unverifiable or wrong for the installed timm (one line).

    ``download_reason``: why the download failed, in a few words, when that is what went wrong (the demo then
    trains in its built-in loop and says why); None for every other refusal."""

    def __init__(self, message: str, download_reason: Optional[str] = None) -> None:
        super().__init__(message)
        self.download_reason = download_reason


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


def fetch_url(url: str, timeout: float = _FETCH_TIMEOUT_S) -> bytes:
    """The bytes at ``url`` (the one place timm-ext downloads scripts; tests replace it)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def probe_url(url: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Ask the server for ``url``'s headers only (HEAD): raises what a download would raise now, and reads no body
    and writes nothing (``timm-ext doctor``'s look at the network; tests replace it)."""
    with urllib.request.urlopen(urllib.request.Request(url, method='HEAD'), timeout=timeout):
        pass


def download_problems(urls: Sequence[str], timeout: Optional[float] = None) -> Dict[str, Optional[str]]:
    """For each URL, None when it can be downloaded now, else why not (a few words).

    The URLs are asked at once, each in a thread, and waited for ``timeout`` seconds in all (default
    :data:`PROBE_TIMEOUT_S`): urllib's own timeout does not bound the name lookup, so a hanging resolver would
    otherwise hold the caller longer.
    """
    timeout = PROBE_TIMEOUT_S if timeout is None else timeout
    outcomes: Dict[str, Optional[BaseException]] = {}

    def ask(url: str) -> None:
        try:
            probe_url(url, timeout)
            outcomes[url] = None
        except BaseException as e:  # handed to the caller: a failure is an answer, an interruption is raised there
            outcomes[url] = e

    threads = [threading.Thread(target=ask, args=(url,), daemon=True) for url in urls]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    answered = dict(outcomes)  # a thread that answers from now on is too late
    return {url: _probe_answer(answered, url, timeout) for url in urls}


def _probe_answer(answered: Dict[str, Optional[BaseException]], url: str, timeout: float) -> Optional[str]:
    """One URL's answer as download_problems gives it: None, why not, or the interruption raised again."""
    if url not in answered:
        return f'no answer within {timeout:g} s'
    error = answered[url]
    if error is not None and not isinstance(error, Exception):
        raise error  # KeyboardInterrupt, SystemExit, a test's failure: not a fact about the network
    return None if error is None else _failure_reason(error, timeout)


def _failure_reason(error: Exception, timeout: float) -> str:
    """urllib's error in a few words: ``[Errno -2] Name or service not known``, ``HTTP 404 Not Found``, ..."""
    if isinstance(error, urllib.error.HTTPError):
        return f'HTTP {error.code} {error.reason}'
    reason = getattr(error, 'reason', None) or error
    if isinstance(reason, TimeoutError):
        return f'no answer within {timeout:g} s'
    return str(reason).strip() or type(reason).__name__


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
    (see :func:`_remembered`), and so is the other script beside it (:func:`_with_sibling_remembered`),
    so the next call finds them without either.
    """
    check_name(name)
    version = _installed_version(timm_version)
    location = locate_script(name, path, allow_unverified, str(version))
    if location.script is None:
        script = _downloaded(location, version, allow_unverified)
    elif remember and location.source != 'cache':
        script = _with_sibling_remembered(_remembered(location.script, version), version)
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
        reason = _failure_reason(e, _FETCH_TIMEOUT_S)
        which = tag if tag == f'v{version.public}' else (
            f'{tag} (timm {version} is installed; {tag} is the newest release timm-ext has a sha256 for)')
        raise ScriptError(
            f'could not download {name} of timm {which} from {url} ({reason}); provide it in one of three other '
            f'ways: {_OPTIONS[name]} PATH, {ENV_SCRIPT}=PATH (timm\'s train.py or its folder), '
            f'or save it as {target}', download_reason=reason) from None
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
    never replaced (:func:`_cache_copy`).
    """
    if script.tag is None or Version(script.tag[1:]) > version:  # unverified: accepted by --allow-unverified
        return script
    flag = _flag(script.source, script.name)
    wanted, _ = _wanted_tag(version, allow_unverified=False)
    target = cache_root() / wanted / script.name
    if script.tag != wanted:
        return _noted(script, f'{script.name} of {script.tag} is not cached: without {flag}, timm {version} looks '
                              f'for the {script.name} of {wanted} ({target})')
    return _noted(script, _cache_copy(script, target, flag, f'{script.name} of {script.tag}'))


def _with_sibling_remembered(script: TimmScript, version: Version) -> TimmScript:
    """Cache the other script beside a given one too (validate.py beside train.py, and the reverse), so that
    ``timm-ext validate`` finds validate.py after one ``timm-ext train --timm-train PATH``.

    Only when the given file is the release the cache is searched for, and the other file that release's
    own script by its sha256; one that is not is left out with a note (it is no error: nothing asked for it).
    """
    if script.tag is None or Version(script.tag[1:]) > version:
        return script
    wanted, _ = _wanted_tag(version, allow_unverified=False)
    name = _BESIDE[script.name]
    path = script.original.parent / name
    if script.tag != wanted or not path.is_file():  # the given file is not cached either (its note says why)
        return script
    digest = sha256_of(path)
    if digest != release_table()[wanted].sha256(name):
        return _noted(script, f'did not cache the {name} beside the given {script.name} ({path}): '
                              f'{_not_the_release(digest, name, wanted)}')
    sibling = TimmScript(name=name, path=path, original=path, source=script.source, sha256=digest, tag=wanted)
    what = f'{name} of {wanted} (beside the given {script.name})'
    return _noted(script, _cache_copy(sibling, cache_root() / wanted / name, _flag(script.source, name), what))


def _not_the_release(digest: str, name: str, tag: str) -> str:
    """Why a file is not ``name`` of ``tag``: the release it is, or that it is none timm-ext knows."""
    tags = tags_of(digest, name)
    if tags:
        return f'it is the {name} of {_span(tags)}, not of {tag}'
    return f'its sha256 {digest[:16]}... is not the {name} of {tag} (nor of any timm release timm-ext knows)'


def _flag(source: str, name: str) -> str:
    """What a later command would need without the cache: ``$TIMM_EXT_TIMM_TRAIN`` or ``name``'s option."""
    return '$' + ENV_SCRIPT if source == ENV_SCRIPT else _OPTIONS[name]


def _noted(script: TimmScript, note: Optional[str]) -> TimmScript:
    """``script`` with ``note`` added to what the command shows (unchanged for None: nothing to say)."""
    return script if note is None else replace(script, notes=script.notes + (note,))


def _cache_copy(script: TimmScript, target: Path, flag: str, what: str) -> Optional[str]:
    """Copy the verified ``script`` to ``target``; the note that says what happened (None: the file was there).

    An existing file is never replaced: the copy is linked in place, which fails when another file got
    there first. ``what`` names the file in the note, ``flag`` what stays needed when it is not cached.
    """
    data = script.original.read_bytes()
    if sha256_of(data) != script.sha256:
        return f'{script.original} changed while it was read; it was not cached'
    try:
        if target.exists():
            return _existing(script, target, flag, what)
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f'.{script.name}.', delete=False) as f:
            f.write(data)
        shutil.copymode(script.original, f.name)  # readable as the given file is, not the temporary file's 0600
        try:
            os.link(f.name, target)  # atomic, and refuses to replace a file another process wrote meanwhile
        except FileExistsError:
            return _existing(script, target, flag, what)
        except OSError:  # a file system without hard links: replace, which is atomic too
            os.replace(f.name, target)
        finally:
            Path(f.name).unlink(missing_ok=True)
    except OSError as e:
        return f'could not cache {what} as {target} ({e.strerror or e}); {flag} stays needed'
    return f'cached {what} as {target}: later commands find it there without {flag}'


def _existing(script: TimmScript, target: Path, flag: str, what: str) -> Optional[str]:
    """The cache already holds ``target``: nothing to say when it is this file, a note when it is not."""
    if target.is_file() and sha256_of(target) == script.sha256:
        return None
    return (f'did not cache {what}: {target} already holds another file, left as it is '
            f'(later commands without {flag} use it; delete it to cache this one)')


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
