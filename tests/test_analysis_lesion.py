"""Lesion study: removing a unit through hooks equals removing it from the model by hand."""
import copy

import pytest
import timm
import torch
import torch.nn as nn

import timm_ext  # noqa: F401 (registers AlterNet)
from timm_ext.analysis.lesion import lesion_study, lesion_units, top1_accuracy

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)


def tiny_vit():
    return timm.create_model('vit_tiny_patch16_224', img_size=16, patch_size=4, depth=2, embed_dim=16, num_heads=2,
                             num_classes=3).eval()


def data():
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(2)]


def test_vit_units_equal_hand_made_lesions():
    model, batches = tiny_vit(), data()
    out = lesion_study(model, batches)
    assert list(out['accuracy']) == ['blocks.0.attn', 'blocks.0.mlp', 'blocks.1.attn', 'blocks.1.mlp']
    assert out['baseline'] == top1_accuracy(model, batches)
    no_msa = copy.deepcopy(model)
    nn.init.zeros_(no_msa.blocks[1].attn.proj.weight)  # the MSA branch outputs zeros: only the residual is left
    nn.init.zeros_(no_msa.blocks[1].attn.proj.bias)
    assert out['accuracy']['blocks.1.attn'] == top1_accuracy(no_msa, batches)
    no_mlp = copy.deepcopy(model)
    nn.init.zeros_(no_mlp.blocks[0].mlp.fc2.weight)
    nn.init.zeros_(no_mlp.blocks[0].mlp.fc2.bias)
    assert out['accuracy']['blocks.0.mlp'] == top1_accuracy(no_mlp, batches)
    assert not any(m._forward_hooks for m in model.modules())


def test_staged_model_removes_shape_preserving_blocks():
    model = timm.create_model('alternet_18_cifar', num_classes=3, channels=(8, 16, 32, 64), num_heads=(1, 1, 1, 1),
                              head_dim=8, stem_chs=8).eval()
    units = lesion_units(model, torch.randn(1, 3, 16, 16))
    # stages.1-3 start with a strided block (new shape): those stay; the stem already has stage 0's width
    assert units == [('stages.0.blocks.0', 'identity'), ('stages.0.blocks.1', 'identity'),
                     ('stages.1.blocks.1', 'identity'), ('stages.2.blocks.1', 'identity'),
                     ('stages.3.blocks.1', 'identity')]
    batches = data()
    out = lesion_study(model, batches, units=units[2:3])
    cut = copy.deepcopy(model)
    cut.stages[1].blocks[1] = nn.Identity()
    assert out['accuracy'] == {'stages.1.blocks.1': top1_accuracy(cut, batches)}


def test_bad_unit():
    with pytest.raises(ValueError, match="bad lesion unit \\('blocks.0.attn', 'drop'\\)"):
        lesion_study(tiny_vit(), data(), units=[('blocks.0.attn', 'drop')])
