import pytest
import timm
import torch

import timm_ext  # noqa: F401
from timm_ext.layers import CBMlp

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)


def test_pit_b_cb_params_match_paper_table_11():
    n = sum(p.numel() for p in timm.create_model('pit_b_cb', device='meta').parameters())
    assert n == sum(p.numel() for p in timm.create_model('pit_b_224', device='meta').parameters())
    assert round(n / 1e6, 1) == 73.8


def test_pit_b_cb_has_cb_in_all_13_blocks_and_timm_keys():
    model = timm.create_model('pit_b_cb', device='meta')
    blocks = [b for s in model.transformers for b in s.blocks]
    assert len(blocks) == 13 and all(isinstance(b.mlp, CBMlp) for b in blocks)
    assert set(model.state_dict()) == set(timm.create_model('pit_b_224', device='meta').state_dict())


def test_pit_group_matcher_puts_each_pool_before_its_stage_blocks():
    model = timm.create_model('pit_b_cb', device='meta')
    groups = timm.models.group_parameters(model, model.group_matcher())
    group_of = {name: gid for gid, names in groups.items() for name in names}
    assert group_of['patch_embed.conv.weight'] == 0
    assert group_of['transformers.0.blocks.2.mlp.fc2.bias'] < group_of['transformers.1.pool.conv.weight']
    assert group_of['transformers.1.pool.conv.weight'] < group_of['transformers.1.blocks.0.norm1.weight']
    # timm convention: the final norm joins the last block's group (MATCH_PREV_GROUP), the head comes last
    assert group_of['transformers.2.blocks.3.mlp.fc2.bias'] == group_of['norm.weight'] < group_of['head.weight']
    assert len(groups) == 1 + 13 + 2 + 1  # stem, 13 blocks, 2 pools, head


def test_pit_cbs_scale_keys_across_stages():
    model = timm.create_model('pit_b_cb', cb_scaled=True, cb_layers=[2, 3], device='meta')
    assert [k for k in model.state_dict() if k.endswith('cb.gamma')] == [
        'transformers.0.blocks.2.mlp.cb.gamma', 'transformers.1.blocks.0.mlp.cb.gamma']
    assert model.transformers[1].blocks[0].mlp.cb.gamma.shape == (512,)


def test_pit_grad_checkpointing_toggles_every_stage():
    model = timm.create_model('pit_b_cb', img_size=64, base_dims=[16, 16, 16], heads=[1, 2, 4])
    model.set_grad_checkpointing(True)
    assert all(s.blocks.grad_checkpointing for s in model.transformers)
    model(torch.randn(1, 3, 64, 64)).sum().backward()
    assert model.patch_embed.conv.weight.grad is not None
