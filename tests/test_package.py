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
