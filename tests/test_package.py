import subprocess
import sys
import textwrap

import pytest
import timm


@pytest.mark.slow
def test_import_registers_models_without_building_anything():
    """``import timm_ext`` only defines and registers: no module is constructed, nothing is fetched."""
    code = textwrap.dedent("""
        import timm, torch
        count = [0]
        orig = torch.nn.Module.__init__
        def counting_init(self, *a, **k):
            count[0] += 1
            orig(self, *a, **k)
        torch.nn.Module.__init__ = counting_init
        before = set(timm.list_models())
        import timm_ext
        added = set(timm.list_models()) - before
        print(count[0], len(added), 'vit_small_cb' in added)
    """)
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True,
                         env={'HF_HUB_OFFLINE': '1', 'PATH': ''})
    modules_built, n_added, has_cb = out.stdout.split()
    assert modules_built == '0' and int(n_added) >= 11 and has_cb == 'True'


def test_version_is_exposed():
    import timm_ext
    assert isinstance(timm_ext.__version__, str) and timm_ext.__version__[0].isdigit()
    assert timm.list_models('vit_*_cb') == ['vit_base_cb', 'vit_small_cb', 'vit_tiny_cb']


def _fresh(code: str) -> str:
    """``code`` in a fresh interpreter (this session may have imported a framework already); its stdout."""
    done = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          env={'HF_HUB_OFFLINE': '1', 'OMP_NUM_THREADS': '1', 'PATH': ''})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_import_adds_no_import_hook_imports_no_framework_and_registers_sams_checks():
    """``import timm_ext`` leaves the import system as it found it (no finder on ``sys.meta_path``, no
    ``sys.path_hooks`` entry), imports no training framework, and registers the Lightning and Accelerate checks
    of SAM by importing their modules explicitly (neither imports its framework)."""
    out = _fresh("""
        import sys
        import huggingface_hub, safetensors, timm, torch, yaml  # what timm_ext itself needs, first
        meta_path, path_hooks = list(sys.meta_path), list(sys.path_hooks)
        import timm_ext
        from timm_ext.optim import framework_checks as checks
        print([f for f in sys.meta_path if f not in meta_path], [h for h in sys.path_hooks if h not in path_hooks])
        print([m for m in ('lightning', 'pytorch_lightning', 'accelerate', 'transformers') if m in sys.modules])
        print(sorted(c.__module__ for c in checks._closure_checks), [c.__module__ for c in checks._stepless_checks])
    """)
    assert out.splitlines() == [
        '[] []', '[]', "['timm_ext.integrations.accelerate', 'timm_ext.integrations.lightning'] "
                       "['timm_ext.integrations.lightning']"]


@pytest.mark.slow
def test_a_framework_imported_after_timm_ext_is_loaded_by_its_own_loader():
    """Nothing of timm-ext stands between a framework and its import: its loader is its own, and its checks are
    registered once."""
    pytest.importorskip('accelerate', reason='accelerate is in the test extra')
    pytest.importorskip('lightning', reason='lightning is in the test extra')
    out = _fresh("""
        import importlib.machinery
        import timm_ext
        import accelerate, lightning
        from timm_ext.optim import framework_checks as checks
        print([type(m.__spec__.loader).__name__ for m in (accelerate, lightning)], len(checks._closure_checks))
    """)
    assert out == "['SourceFileLoader', 'SourceFileLoader'] 2"


def test_subpackages_are_reachable_after_a_plain_import_and_imported_only_when_used():
    """docs/hub.md's ``timm_ext.hub.load_model`` after ``import timm_ext`` (no AttributeError), without making
    ``import timm_ext`` import the hub, analysis or recipes code."""
    out = _fresh("""
        import sys
        import timm_ext
        lazy = ('analysis', 'catalog', 'data', 'demo', 'hub', 'recipes')
        print([name for name in lazy if f'timm_ext.{name}' in sys.modules])
        print(timm_ext.hub.load_model.__module__, timm_ext.recipes.list_recipes.__name__)
        try:
            timm_ext.hubb
        except AttributeError as error:
            print(error)
    """)
    assert out.splitlines() == ['[]', 'timm_ext.hub._load list_recipes', "module 'timm_ext' has no attribute 'hubb'"]
