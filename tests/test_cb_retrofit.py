import pytest
import timm
import torch
from safetensors.torch import load_file, save_file

import timm_ext  # noqa: F401
from timm_ext.layers import CBMlp
from timm_ext.models import add_context_broadcast
from timm_ext.models.cb_retrofit import fill_missing_cb_scales, resolve_cb_layers

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)


def _tiny_vit():
    return timm.create_model('vit_tiny_patch16_224', img_size=32, depth=4).eval()


def test_retrofit_in_place_keeps_keys_and_changes_output():
    model = _tiny_vit()
    keys = list(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        before = model(x)
        out = add_context_broadcast(model, layers=[1, 3])
        after = model(x)
    assert out is model and list(model.state_dict()) == keys
    assert [isinstance(b.mlp, CBMlp) for b in model.blocks] == [False, True, False, True]
    assert not torch.allclose(before, after, atol=1e-4)


def test_pretrained_base_weights_load_into_retrofitted_model(tmp_path):
    base = _tiny_vit()
    path = tmp_path / 'base.safetensors'
    save_file(base.state_dict(), str(path))
    model = add_context_broadcast(_tiny_vit(), layers='all')
    model.load_state_dict(load_file(str(path)), strict=True)
    assert torch.equal(model.blocks[2].mlp.fc1.weight, base.blocks[2].mlp.fc1.weight)


def test_retrofit_scaled_adds_one_vector_per_block():
    model = add_context_broadcast(_tiny_vit(), layers='upper', scaled=True, init_value=0.5)
    new_keys = [k for k in model.state_dict() if k.endswith('cb.gamma')]
    assert new_keys == ['blocks.2.mlp.cb.gamma', 'blocks.3.mlp.cb.gamma']
    assert torch.equal(model.blocks[2].mlp.cb.gamma, torch.full((192,), 0.5))


def test_retrofit_mixer_targets_channel_mlp_only():
    model = timm.create_model('mixer_s16_224', img_size=32)
    add_context_broadcast(model, layers='all')
    assert all(isinstance(b.mlp_channels, CBMlp) and not isinstance(b.mlp_tokens, CBMlp) for b in model.blocks)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)


def test_retrofit_pit_counts_blocks_across_stages():
    model = timm.create_model('pit_ti_224', img_size=64)
    add_context_broadcast(model, layers=[0, 11], patch_mean=True)
    blocks = [b for stage in model.transformers for b in stage.blocks]
    assert len(blocks) == 12 and [i for i, b in enumerate(blocks) if isinstance(b.mlp, CBMlp)] == [0, 11]
    assert blocks[0].mlp.cb.num_prefix_tokens == 1


def test_retrofit_twice_replaces_the_cb():
    model = add_context_broadcast(_tiny_vit(), layers='all')
    add_context_broadcast(model, layers='all', scaled=True)
    assert all(b.mlp.cb.scaled and isinstance(b.mlp.fc1, torch.nn.Linear) for b in model.blocks)


def test_unsupported_model_type_is_rejected():
    with pytest.raises(ValueError, match=r'cannot be added to a ResNet; supported: VisionTransformer'):
        add_context_broadcast(timm.create_model('resnet18'))


def test_unsupported_block_type_is_rejected():
    model = timm.create_model('vit_small_patch16_224', block_fn=timm.models.vision_transformer.ParallelScalingBlock,
                              depth=2, device='meta')
    with pytest.raises(ValueError, match='Block 0 of this VisionTransformer is a ParallelScalingBlock'):
        add_context_broadcast(model)


def test_layer_index_outside_depth_is_rejected():
    with pytest.raises(ValueError, match=r'cb_layers \[4\] outside the model depth: block indices must be in 0..3'):
        add_context_broadcast(_tiny_vit(), layers=[0, 4])


def test_retrofit_init_value_needs_scaled():
    with pytest.raises(ValueError, match=r'init_value=0.5 sets the initial Lambda of CB_S, but this is plain CB'):
        add_context_broadcast(_tiny_vit(), init_value=0.5)


def test_retrofit_keeps_frozen_parameters_frozen_and_mode():
    model = _tiny_vit().train()
    model.blocks[1].mlp.fc1.weight.requires_grad_(False)
    add_context_broadcast(model, layers=[1])
    assert not model.blocks[1].mlp.fc1.weight.requires_grad and model.blocks[1].mlp.fc2.weight.requires_grad
    assert model.blocks[1].mlp.training


def test_resolve_cb_layers():
    assert resolve_cb_layers('upper', 7) == (3, 4, 5, 6)
    assert resolve_cb_layers(None, 3) == (0, 1, 2)
    assert resolve_cb_layers([2, 0, 2], 3) == (0, 2)
    assert resolve_cb_layers(range(1, 3), 3) == (1, 2)
    with pytest.raises(ValueError, match=r'cb_layers \[True\] are not block indices'):
        resolve_cb_layers([True], 3)


def test_fill_missing_cb_scales_only_fills_gamma(caplog):
    model = add_context_broadcast(_tiny_vit(), layers=[3], scaled=True)
    sd = {k: v for k, v in model.state_dict().items() if not k.endswith('cb.gamma')}
    filled = fill_missing_cb_scales(sd, model)
    assert set(filled) == set(model.state_dict()) and 'blocks.3.mlp.cb.gamma' not in sd
    assert '1 CB_S scale(s) not in the checkpoint keep their init value (blocks.3.mlp.cb.gamma)' in caplog.text
