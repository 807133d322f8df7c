import pytest
import timm
import torch

import timm_ext  # noqa: F401
from timm_ext.layers import CBMlp

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)


def test_mixer_s16_cb_params_match_paper_table_11():
    n = sum(p.numel() for p in timm.create_model('mixer_s16_cb', device='meta').parameters())
    assert n == sum(p.numel() for p in timm.create_model('mixer_s16_224', device='meta').parameters())
    assert round(n / 1e6, 1) == 18.5


def test_mixer_cb_sits_on_channel_mlp_of_every_block():
    model = timm.create_model('mixer_s16_cb', device='meta')
    assert len(model.blocks) == 8
    assert all(isinstance(b.mlp_channels, CBMlp) and type(b.mlp_tokens) is not CBMlp for b in model.blocks)


def test_mixer_cb_matches_hand_reference():
    model = timm.create_model('mixer_s16_cb', img_size=32).eval()
    base = timm.create_model('mixer_s16_224', img_size=32).eval()
    base.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        h = base.stem(x)
        for blk in base.blocks:
            h = h + blk.mlp_tokens(blk.norm1(h).transpose(1, 2)).transpose(1, 2)
            m = blk.mlp_channels(blk.norm2(h))
            h = h + 0.5 * (m + m.mean(dim=1, keepdim=True))
        torch.testing.assert_close(model(x), base.forward_head(base.norm(h)))
