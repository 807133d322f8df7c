"""timm_ext.integrations.autoload: a framework's integration module is imported when, and only when, the framework
is: at ``install()`` for a framework already imported, by the post-import hook for one imported later, never in a
process that never imports it. ``import timm_ext`` imports no framework itself, and importing Lightning or
Accelerate after it registers their checks with ``timm_ext.optim.framework_checks``.

The hook itself is checked with a fake framework package and a fake integration module written to ``tmp_path``
(on ``sys.path``); the real frameworks in fresh processes, since this test session may have imported them already.
"""
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from timm_ext.integrations import autoload

REPO = Path(__file__).resolve().parents[1]
FRAMEWORK, INTEGRATION = 'fakeframework', 'fake_integration'
UNRELATED = 'fake_unrelated'  # a module the hook does not watch
FRAMEWORKS = ('lightning', 'pytorch_lightning', 'accelerate', 'transformers')


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake framework (a package whose body ends by setting READY) and its integration module (which notes
    whether the framework was fully imported when it ran), importable from ``tmp_path``; the import system (the
    meta path, sys.modules) as it was afterwards."""
    package = tmp_path / FRAMEWORK
    package.mkdir()
    (package / '__init__.py').write_text('READY = False\nfrom . import core  # noqa\nREADY = True\n')
    (package / 'core.py').write_text('VALUE = 1\n')
    (tmp_path / f'{UNRELATED}.py').write_text('VALUE = 2\n')
    (tmp_path / f'{INTEGRATION}.py').write_text(textwrap.dedent(f"""
        import sys
        FRAMEWORK_READY = getattr(sys.modules.get({FRAMEWORK!r}), 'READY', None)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, 'meta_path', list(sys.meta_path))  # install()'s finder goes with the test
    importlib.invalidate_caches()
    yield tmp_path
    for name in list(sys.modules):
        if name in (INTEGRATION, FRAMEWORK, UNRELATED) or name.startswith(FRAMEWORK + '.'):
            del sys.modules[name]


def _python(code: str, cwd: Path) -> str:
    """``code`` run by this interpreter in a fresh process; its stdout's last line."""
    done = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _env() -> dict:
    return dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1',
                PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get('PYTHONPATH', '')]))


# ---- the hook, with a fake framework -----------------------------------------------------------------------------

def test_integration_is_imported_when_the_framework_is_not_before(fake):
    assert FRAMEWORK not in sys.modules and INTEGRATION not in sys.modules
    autoload.install({FRAMEWORK: INTEGRATION})
    assert INTEGRATION not in sys.modules  # installing imports nothing for a framework not imported
    assert importlib.import_module(UNRELATED).VALUE == 2  # another import passes through untouched
    assert INTEGRATION not in sys.modules
    framework = importlib.import_module(FRAMEWORK)
    assert INTEGRATION in sys.modules
    assert sys.modules[INTEGRATION].FRAMEWORK_READY is True  # after the framework's own body ran, whole
    assert framework.READY and framework.core.VALUE == 1  # the framework itself imported as without the hook
    assert framework.__spec__.origin == str(fake / FRAMEWORK / '__init__.py')


def test_integration_is_imported_at_install_when_the_framework_already_was(fake):
    framework = importlib.import_module(FRAMEWORK)
    assert framework.READY and INTEGRATION not in sys.modules  # nothing watches the fake framework yet
    finders = list(sys.meta_path)
    autoload.install({FRAMEWORK: INTEGRATION})
    assert INTEGRATION in sys.modules and sys.modules[INTEGRATION].FRAMEWORK_READY is True
    assert sys.meta_path == finders  # nothing is pending, so no finder is added


def test_installing_twice_adds_one_finder(fake):
    before = len(sys.meta_path)
    autoload.install({FRAMEWORK: INTEGRATION})
    autoload.install({FRAMEWORK: INTEGRATION})
    assert len(sys.meta_path) == before + 1
    importlib.import_module(FRAMEWORK)
    assert sys.modules[INTEGRATION].FRAMEWORK_READY is True


def test_a_process_that_never_imports_the_framework_never_imports_the_integration(fake):
    code = f"""
        import sys
        sys.path.insert(0, {str(fake)!r})
        import timm_ext  # noqa: F401
        from timm_ext.integrations import autoload
        autoload.install({{{FRAMEWORK!r}: {INTEGRATION!r}}})
        import json, email.utils, timm, {UNRELATED}  # noqa: F401  (everything but the framework)
        print({INTEGRATION!r} in sys.modules, {FRAMEWORK!r} in sys.modules)
    """
    assert _python(code, fake) == 'False False'
    # the same process, importing the framework at the end: the check above can fail
    importing = code.replace('print(', f'import {FRAMEWORK}; print(')
    assert _python(importing, fake) == 'True True'


# ---- the real frameworks ------------------------------------------------------------------------------------------

def test_import_timm_ext_imports_no_framework(tmp_path):
    code = ("import timm_ext, sys; "
            "print([m for m in ('lightning','pytorch_lightning','accelerate','transformers') if m in sys.modules])")
    assert _python(code, tmp_path) == '[]'


_REGISTERED = """
    import json, sys
    {first}
    from timm_ext.optim import framework_checks

    def registered():
        return [[c.__module__ for c in framework_checks._closure_checks],
                [c.__module__ for c in framework_checks._stepless_checks]]

    before = registered()
    {second}
    print(json.dumps(dict(imported={integration!r} in sys.modules, before=before, after=registered())))
"""


@pytest.mark.slow
@pytest.mark.parametrize('framework, integration, stepless, order', [
    ('lightning', 'timm_ext.integrations.lightning', 1, 'timm_ext first'),
    ('lightning', 'timm_ext.integrations.lightning', 1, 'framework first'),
    ('pytorch_lightning', 'timm_ext.integrations.lightning', 1, 'timm_ext first'),
    ('accelerate', 'timm_ext.integrations.accelerate', 0, 'timm_ext first'),
])
def test_importing_a_framework_registers_its_checks(tmp_path, framework, integration, stepless, order):
    """Lightning registers a closure check and a stepless one, Accelerate a closure check, each once, whether the
    framework is imported after timm_ext (the post-import hook) or before it (install() at ``import timm_ext``)."""
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f'{framework} is not installed')
    imports = ['import timm_ext', f'import {framework}']
    first, second = imports if order == 'timm_ext first' else imports[::-1]
    out = json.loads(_python(_REGISTERED.format(first=first, second=second, integration=integration), tmp_path))
    assert out['imported'], out
    closure, stepless_checks = out['after']
    assert closure.count(integration) == 1 and stepless_checks.count(integration) == stepless, out
    if order == 'timm_ext first':  # nothing of the framework's before its import
        assert integration not in out['before'][0] + out['before'][1], out
    else:  # already there when timm_ext was imported
        assert out['before'] == out['after'], out
