"""``timm_ext.catalog``: every registered model is measured (``timm-ext models`` lists them all)."""
import pytest

from timm_ext.catalog import list_timm_ext_models, model_info


@pytest.mark.timm_models_only
@pytest.mark.parametrize('name', list_timm_ext_models())
def test_every_model_is_measured(name):
    info = model_info(name)
    assert info.params > 0 and info.gmacs > 0 and info.num_classes in (10, 100, 1000)


@pytest.mark.timm_models_only
def test_pit_b_cb_matches_the_paper_size():
    """PiT's forward passes tensors through tuples; counting MACs under no_grad must not trip autograd hooks."""
    info = model_info('pit_b_cb')
    assert round(info.params / 1e6, 1) == 73.8  # CB paper, Table 11: PiT-B 73.8M
    assert 12.0 < info.gmacs < 12.8  # timm's pit_b_224: 12.4 GMACs


@pytest.mark.slow
def test_the_committed_models_table_is_the_measured_one():
    """``timm-ext models`` answers from timm_ext/_data/models.tsv without torch: it must be what is measured now."""
    from timm_ext.catalog import models_table_text
    from timm_ext_cli.commands import MODELS_TABLE, package_dir

    committed = (package_dir() / MODELS_TABLE).read_text()
    assert committed == models_table_text(), (
        'timm_ext/_data/models.tsv is stale: python -c "from timm_ext.catalog import write_models_table; '
        'write_models_table()"')
