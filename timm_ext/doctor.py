"""What a bug report needs to know about this environment, and whether a training run can start.

``timm-ext doctor`` prints :func:`collect`'s report, like ``python -m torch.utils.collect_env`` or
``huggingface-cli env``: the versions timm-ext runs on, whether torch and torchvision match (one
torchvision op is run), the devices, which timm ``train.py``/``validate.py`` would be used and whether
their sha256 is known, the cache and the offline setting. Nothing is downloaded or written: a script
that is neither given nor cached is asked of the server (HEAD, both at once, at most
:data:`~timm_ext.launch.timm_scripts.PROBE_TIMEOUT_S` seconds; not while offline), so that
"downloadable" means now.

A check is *required* when a training run (``timm-ext train``) cannot start without it: python,
torch, torchvision (timm imports it), timm, safetensors and huggingface-hub at the versions timm-ext
declares, and a train.py that is given, cached or downloadable now. The others (validate.py, devices,
cache, offline) are reported, and a problem in them is a warning. :attr:`DoctorReport.commands` says
which commands can start: ``demo`` (its built-in loop needs no script), ``train``, ``validate``.
"""
import importlib
import importlib.metadata
import os
import platform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from timm_ext._requirements import DIST as _DIST
from timm_ext._requirements import declared_requirements, version_problem

if TYPE_CHECKING:  # imported where used: `timm-ext doctor` reports a broken install instead of failing to import
    from timm_ext.launch.timm_scripts import ScriptLocation

__all__ = ['Check', 'DoctorReport', 'collect']

_OFFLINE_VARS = ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE')
_TRUE = {'1', 'ON', 'YES', 'TRUE'}  # huggingface_hub's reading of its boolean environment variables
_SCRIPT_COMMANDS = {'train.py': 'train', 'validate.py': 'validate'}  # the command that cannot start without it
_REQUIRED_SCRIPT = 'train.py'
_DEMO = 'timm-ext demo runs without it (built-in loop)'
_READY = 'ready: everything a training run needs is there'


@dataclass(frozen=True)
class Check:
    """One line of the report: what was found (``value``), whether it is fine, and the fix when not."""
    name: str
    value: str
    ok: bool = True
    fix: Optional[str] = None
    required: bool = True
    details: Dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return 'ok' if self.ok else 'FAIL' if self.required else 'warn'


@dataclass(frozen=True)
class DoctorReport:
    checks: Tuple[Check, ...]

    @property
    def ok(self) -> bool:
        """True when everything a training run needs is there."""
        return all(check.ok for check in self.checks if check.required)

    @property
    def fix(self) -> Optional[str]:
        """The one line to act on first: the fix of the first required check that failed."""
        return next((check.fix for check in self.checks if check.required and not check.ok), None)

    def __getitem__(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f'no check named {name!r}; the checks: {", ".join(c.name for c in self.checks)}')

    @property
    def commands(self) -> Dict[str, bool]:
        """Which commands can start: ``demo`` needs the required packages only, ``train`` and ``validate`` their
        script too."""
        packages = all(c.ok for c in self.checks if c.required and c.name not in _SCRIPT_COMMANDS)
        return {**{command: packages and self[name].ok for name, command in _SCRIPT_COMMANDS.items()},
                'demo': packages}

    @property
    def summary(self) -> str:
        """The last line: ready or not, which commands cannot start for want of a script, and what to do first."""
        if not self.commands['demo']:
            return f'not ready: {self.fix}'
        missing = [c for c in self.checks if c.name in _SCRIPT_COMMANDS and not c.ok]
        if not missing:
            return _READY
        line = f'timm-ext {" and ".join(_SCRIPT_COMMANDS[c.name] for c in missing)} cannot start: {missing[0].fix}'
        return f'{_READY}; {line}' if self.ok else f'not ready: {line}'

    def as_dict(self) -> Dict[str, Any]:
        """JSON-ready: ``ok``, ``fix``, ``summary`` (the text's last line), ``commands`` and each check by name
        (value, ok, required, fix and its details)."""
        return {'ok': self.ok, 'fix': self.fix, 'summary': self.summary, 'commands': self.commands, 'checks': {
            c.name: dict(value=c.value, ok=c.ok, required=c.required, fix=c.fix, **c.details) for c in self.checks}}


def collect(
        timm_train: Optional[str] = None,
        timm_validate: Optional[str] = None,
        allow_unverified: bool = False,
) -> DoctorReport:
    """Check this environment; ``timm_train``/``timm_validate`` as ``timm-ext train``/``validate`` take them."""
    requirements = declared_requirements()
    offline = _offline_reasons()
    torch, torch_check = _package('torch', requirements)
    checks = [_python(), _platform(), torch_check, _torchvision(torch, requirements)]
    timm, timm_check = _package('timm', requirements)
    checks += [timm_check, _timm_ext(), _package('safetensors', requirements)[1],
               _package('huggingface_hub', requirements, dist='huggingface-hub')[1], _devices(torch)]
    checks += [*_scripts({'train.py': timm_train, 'validate.py': timm_validate}, allow_unverified, offline,
                         timm_ok=timm is not None),
               _cache(), _offline(offline)]
    return DoctorReport(tuple(checks))


def _install(dist: str, requirements: Dict[str, Requirement]) -> str:
    req = requirements.get(canonicalize_name(dist))
    return f'pip install "{req}"' if req is not None else f'pip install {dist}'


def _python() -> Check:
    version = platform.python_version()
    details = {'version': version, 'implementation': platform.python_implementation(), 'executable': sys.executable}
    value = f'{version} ({details["implementation"]}) {sys.executable}'
    try:
        needed = importlib.metadata.metadata(_DIST).get('Requires-Python')
    except importlib.metadata.PackageNotFoundError:
        needed = None
    if needed and not SpecifierSet(needed).contains(version, prereleases=True):
        return Check('python', value, ok=False, details=details,
                     fix=f'timm-ext needs Python {needed}, this is {version}: use a newer Python')
    return Check('python', value, details=details)


def _platform() -> Check:
    details = {'system': platform.platform(), 'machine': platform.machine(), 'cpu_count': os.cpu_count()}
    return Check('platform', f'{details["system"]}, {details["cpu_count"]} CPUs', required=False, details=details)


def _package(module: str, requirements: Dict[str, Requirement], dist: Optional[str] = None) -> Tuple[Any, Check]:
    """Import ``module``; its version, checked against timm-ext's requirement on it."""
    dist = dist or module
    try:
        imported = importlib.import_module(module)
    except Exception as e:  # ImportError, or whatever a broken install raises while importing
        return None, Check(dist, f'not importable: {type(e).__name__}: {_one_line(e)}', ok=False,
                           fix=f'{dist} cannot be imported ({_one_line(e)}): {_install(dist, requirements)}',
                           details={'version': None})
    version = str(getattr(imported, '__version__', None) or _dist_version(dist))
    details: Dict[str, Any] = {'version': version}
    value = version
    if module == 'torch':
        details.update(cuda_build=imported.version.cuda, threads=imported.get_num_threads())
        build = f'CUDA {details["cuda_build"]} build' if details['cuda_build'] else 'CPU build'
        value = f'{version} ({build}), {details["threads"]} threads'
    problem = version_problem(dist, version, requirements)
    if problem:
        return imported, Check(dist, value, ok=False, details=details, fix=problem)
    return imported, Check(dist, value, details=details)


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return 'unknown'


def _torchvision(torch: Any, requirements: Dict[str, Requirement]) -> Check:
    """torchvision imported and one of its compiled ops run: a torchvision built for another torch fails here."""
    torchvision, check = _package('torchvision', requirements)
    if torchvision is None or torch is None:
        return check
    version = check.details['version']
    reinstall = (f'torchvision {version} does not match torch {torch.__version__}: reinstall both from the same '
                 f'index (pip install --force-reinstall torch torchvision)')
    try:
        boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.9], [2.0, 2.0, 3.0, 3.0]])
        kept = torchvision.ops.nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist()
    except Exception as e:  # "operator torchvision::nms does not exist", "Couldn't load custom C++ ops", ...
        return Check('torchvision', f'{version}; torchvision.ops.nms fails: {type(e).__name__}: {_one_line(e)}',
                     ok=False, fix=reinstall, details=dict(check.details, ops=False))
    if kept != [0, 2]:
        return Check('torchvision', f'{version}; torchvision.ops.nms kept boxes {kept}, not [0, 2]', ok=False,
                     fix=reinstall, details=dict(check.details, ops=False))
    return Check('torchvision', f'{version} (torchvision.ops.nms runs)', details=dict(check.details, ops=True))


def _timm_ext() -> Check:
    from timm_ext.version import __version__

    location = str(Path(__file__).resolve().parent)
    return Check('timm-ext', f'{__version__} ({location})', details={'version': __version__, 'location': location})


def _devices(torch: Any) -> Check:
    """CUDA devices (name, compute capability, memory) and Apple's MPS; a CPU-only machine trains too."""
    if torch is None:
        return Check('devices', 'unknown: torch cannot be imported', required=False, details={'cuda': [], 'mps': None})
    try:
        cuda = [_cuda_device(torch, i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    except Exception as e:  # a driver that torch cannot talk to
        return Check('devices', f'CUDA error: {type(e).__name__}: {_one_line(e)}', ok=False, required=False,
                     fix=f'torch cannot use the CUDA driver ({_one_line(e)}): check nvidia-smi and the torch build',
                     details={'cuda': [], 'mps': None})
    mps = bool(getattr(torch.backends, 'mps', None) and torch.backends.mps.is_available())
    parts = [f'cuda:{d["index"]} {d["name"]} (sm_{d["capability"].replace(".", "")}, {d["memory_gib"]} GiB)'
             for d in cuda] + (['mps'] if mps else [])
    value = ', '.join(parts) if parts else 'CPU only (torch.cuda.is_available() is False)'
    return Check('devices', value, required=False, details={'cuda': cuda, 'mps': mps})


def _cuda_device(torch: Any, index: int) -> Dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    return {'index': index, 'name': props.name, 'capability': f'{props.major}.{props.minor}',
            'memory_gib': round(props.total_memory / 2 ** 30, 1)}


def _scripts(paths: Dict[str, Optional[str]], allow_unverified: bool, offline: List[str], timm_ok: bool) -> List[Check]:
    """train.py and validate.py, each given, cached or downloadable now: the URLs of those on this machine in
    neither way are asked together (one timeout for both), and not at all while offline."""
    from timm_ext.launch.timm_scripts import download_problems

    found = {name: _locate(name, path, allow_unverified, timm_ok) for name, path in paths.items()}
    urls = [f.url for f in found.values() if not isinstance(f, Check) and f.script is None]
    answers = download_problems(urls) if urls and not offline else {}
    return [f if isinstance(f, Check) else _script(f, answers, offline) for f in found.values()]


def _locate(name: str, path: Optional[str], allow_unverified: bool, timm_ok: bool) -> Union[Check, 'ScriptLocation']:
    """Where ``name`` would come from, or the failed check when it is refused or cannot be known."""
    from timm_ext.launch.timm_scripts import ScriptError, locate_script

    required = name == _REQUIRED_SCRIPT
    if not timm_ok:
        return Check(name, 'unknown: timm cannot be imported', ok=False, required=required,
                     fix=f'install timm first; then `timm-ext doctor` says which {name} is used',
                     details={'source': None, 'path': None})
    try:
        return locate_script(name, path=path, allow_unverified=allow_unverified)
    except (ScriptError, ValueError) as e:  # ValueError: timm's own version is not a version number
        return Check(name, f'refused: {e}', ok=False, required=required, fix=str(e),
                     details={'source': None, 'path': None, 'error': str(e)})


def _script(location: 'ScriptLocation', answers: Dict[str, Optional[str]], offline: List[str]) -> Check:
    """Which file a run would use (given, $TIMM_EXT_TIMM_TRAIN, cache) and whether its sha256 is known; or, when
    none, whether it can be downloaded now (``answers``: the URL's problem, None when it answered)."""
    from timm_ext.launch.release_table import release_table

    name, required = location.name, location.name == _REQUIRED_SCRIPT
    details: Dict[str, Any] = {'source': location.source, 'path': str(location.path), 'tag': location.tag,
                               'sha256': None, 'sha256_known': None, 'url': location.url,
                               'downloadable': None, 'download_error': None, 'notes': list(location.notes)}
    if location.script is None:
        return _not_here(location, answers.get(location.url), offline, details)
    script = location.script
    details.update(sha256=script.sha256, sha256_known=script.tag is not None)
    row = release_table().get(script.tag) if script.tag else None
    if name == 'train.py' and row is not None and not row.has_task_api:
        details['patched'] = True
    if details['sha256_known']:
        known = f'sha256 known: {name} of {script.tag}'
    else:
        known = f'sha256 {script.sha256[:16]}... unknown: runs only with --allow-unverified'
    extra = ', run as timm-ext\'s patched copy (no task API)' if details.get('patched') else ''
    return Check(name, f'{script.path} (from {location.source}; {known}{extra})', required=required, details=details)


def _not_here(location: 'ScriptLocation', problem: Optional[str], offline: List[str], details: Dict[str, Any]) -> Check:
    """A script neither given nor cached: fine when its URL answered just now, else what to do instead."""
    name, required = location.name, location.name == _REQUIRED_SCRIPT
    details.update(path=None, download_to=str(location.path))
    if offline:
        value = f'not given or cached; a download was not tried: offline ({", ".join(offline)})'
        return Check(name, value, ok=False, required=required, details=details, fix=_provide(location))
    details.update(downloadable=problem is None, download_error=problem)
    if problem is None:
        value = f'not given or cached; downloadable now from {location.url} (saved as {location.path} on first use)'
        return Check(name, value, required=required, details=details)
    value = f'not given or cached, and not downloadable now: {location.url} ({problem})'
    return Check(name, value, ok=False, required=required, details=details, fix=_provide(location))


def _provide(location: 'ScriptLocation') -> str:
    """The other ways to give a script that cannot be downloaded, and that the demo needs none."""
    from timm_ext.launch.timm_scripts import ENV_SCRIPT

    name = location.name
    flag, other = ('--timm-train', 'validate.py') if name == 'train.py' else ('--timm-validate', 'train.py')
    return (f'give {name} once with {flag} PATH or {ENV_SCRIPT}=PATH (timm\'s {name} or its folder; it is then '
            f'cached, with the {other} beside it), or save the {name} of {location.tag} as {location.path}; {_DEMO}')


def _cache() -> Check:
    """The folder scripts are cached in; it must be writable for a download or a given file to be kept."""
    from timm_ext.launch.timm_scripts import ENV_CACHE, cache_root

    root = cache_root()
    existing = next(p for p in (root, *root.parents) if p.exists())
    writable = existing.is_dir() and os.access(existing, os.W_OK)
    try:
        held = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    except OSError:  # a folder this user may not list
        held = []
    details = {'path': str(root), 'exists': root.is_dir(), 'writable': writable, 'tags': held}
    state = (f'holds {", ".join(held)}' if held else 'empty') if root.is_dir() else 'not created yet'
    value = f'{root} ({state})'
    if not writable:
        return Check('cache', value + ', not writable', ok=False, required=False, details=details,
                     fix=f'{existing} is not a writable folder: set {ENV_CACHE} to one')
    return Check('cache', value, required=False, details=details)


def _offline_reasons() -> List[str]:
    """The settings that make this an offline run: huggingface_hub's environment variables and constant."""
    reasons = [f'{var}={os.environ[var]}' for var in _OFFLINE_VARS if os.environ.get(var, '').upper() in _TRUE]
    try:
        from huggingface_hub import constants
    except Exception:  # huggingface_hub missing: its own check says so
        return reasons
    if not reasons and getattr(constants, 'HF_HUB_OFFLINE', False):
        reasons.append('huggingface_hub.constants.HF_HUB_OFFLINE')
    return reasons


def _offline(reasons: List[str]) -> Check:
    value = f'yes ({", ".join(reasons)})' if reasons else 'no'
    return Check('offline', value, required=False, details={'offline': bool(reasons), 'reasons': reasons})


def _one_line(error: BaseException) -> str:
    text = ' '.join(str(error).split())
    return text if len(text) <= 200 else text[:197] + '...'
