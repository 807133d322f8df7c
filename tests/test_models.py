"""timm behaviours every timm-ext model must show, parametrised over the registry.

The first part is timm's own model contract (its tests/test_models.py): every model traces with
``torch.fx`` through timm's FX feature extraction (forward and backward), compiles with TorchScript,
and both together. The timm bases of our families (``vit_small_patch16_224``, ``pit_b_224``,
``mixer_s16_224``, ``volo_d1_224``, ``resnetv2_50``) pass all four with current torch; where a base
itself does not FX-trace (timm 1.0.28's ViT attention on torch 2.4 passes an FX proxy as SDPA's
``is_causal``), the FX tests of that family skip and say so. Inputs are small so the suite runs on
2 CPU cores; the largest models are marked slow.
"""
import copy
import fnmatch
import functools
import warnings
from typing import Dict, Optional, Tuple

import pytest
import timm
import torch
from packaging.version import Version
from timm.layers import get_channel_dim, get_spatial_dim
from timm.models import model_entrypoint
from timm.models._features_fx import get_notrace_functions, get_notrace_modules
from timm.utils import AttentionExtract
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import timm_ext  # noqa: F401
from timm_ext.models import AlterNet

TIMM_EXT_MODELS = sorted(n for n in timm.list_models() if model_entrypoint(n).__module__.startswith('timm_ext.'))
# image side per family: the smallest input each family's real config accepts, as timm's tests shrink inputs
IMG_SIZE = {'vision_transformer_cb': 32, 'vision_transformer_convstem': 32, 'mlp_mixer_cb': 32, 'mlp_mixer_p8': 32,
             'pit_cb': 56, 'volo_convstem': 64}
# the largest; > 5 s each on 2 cores
_SLOW = ('vit_base_*', 'alternet_101*', 'alternet_152*', 'volo_d1_convstem', 'swin_tiny_patch1_window4_32')
SCRIPT_WARNING = 'ignore:`torch.jit.script` is deprecated:FutureWarning'


# sizes of one architecture in our names, smallest first: a name with a later size is the larger sibling of the name
# with the group's first size (alternet_18/34 have basic blocks, 50/101/152 bottlenecks: two groups)
_SIZES = (('tiny', 'small', 'base'), ('18', '34'), ('50', '101', '152'), ('s8', 'b8'))


def _sibling_of(name: str) -> Optional[str]:
    """The smallest registered model of ``name``'s architecture when ``name`` is a larger size of it, else None.
    test_a_larger_sibling_has_the_classes_of_the_model_that_runs checks that the two are built of the same classes."""
    tokens = name.split('_')
    for i, token in enumerate(tokens):
        for sizes in _SIZES:
            if token in sizes[1:]:
                smallest = '_'.join(tokens[:i] + [sizes[0]] + tokens[i + 1:])
                return smallest if smallest in TIMM_EXT_MODELS else None
    return None


LARGER_SIBLINGS = {n: s for n in TIMM_EXT_MODELS if (s := _sibling_of(n))}


def _params(names):
    """Model names as pytest params, the largest ones marked slow, the larger siblings ``larger_sibling`` (the
    release and floor lanes of .ci/run run the contract on the smallest of each architecture, the newest on all)."""
    params = []
    for n in names:
        marks = [pytest.mark.slow] if any(fnmatch.fnmatch(n, p) for p in _SLOW) else []
        marks += [pytest.mark.larger_sibling] if n in LARGER_SIBLINGS else []
        params.append(pytest.param(n, marks=marks))
    return params


def create_small(name: str, **kwargs) -> Tuple[torch.nn.Module, Tuple[int, int, int]]:
    """The registered model at a small input size, and that input size."""
    family = model_entrypoint(name).__module__.rsplit('.', 1)[-1]
    if family in IMG_SIZE:
        kwargs['img_size'] = size = IMG_SIZE[family]
    else:  # AlterNet takes any size: its CIFAR configs' 32, else 64
        size = min(timm.get_pretrained_cfg(name).input_size[-1], 64)
    return timm.create_model(name, **kwargs), (3, size, size)


_BASES = {'vision_transformer_cb': 'vit_small_patch16_224', 'vision_transformer_convstem': 'vit_small_patch16_224',
          'pit_cb': 'pit_b_224', 'mlp_mixer_cb': 'mixer_s16_224', 'volo_convstem': 'volo_d1_224',
          'alternet': 'resnetv2_50', 'hdvw_baselines': 'resnet50', 'mlp_mixer_p8': 'mixer_s16_224'}


@functools.lru_cache(maxsize=None)
def _base_fx_problem(family: str) -> str:
    """Why the timm base of ``family`` does not FX-trace here ('' when it does)."""
    base = _BASES[family]
    kwargs = {'img_size': IMG_SIZE[family]} if family in IMG_SIZE else {}
    with torch.device('meta'):
        model = timm.create_model(base, **kwargs).eval()
    try:
        get_graph_node_names(model, tracer_kwargs=dict(
            leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions()))
    except Exception as e:  # noqa: BLE001  any tracing failure of timm's own model
        return (f'timm\'s own {base} does not FX-trace with torch {torch.__version__} and timm {timm.__version__}: '
                f'{type(e).__name__}: {str(e)[:120]}')
    return ''


class _Contract:
    """One registered model (scriptable, eval mode) and, built once on first use, its FX graph: the output node
    through timm's FX feature extraction (timm's leaf modules and autowrapped functions), in train and eval mode."""

    def __init__(self, name: str) -> None:
        self.family = model_entrypoint(name).__module__.rsplit('.', 1)[-1]
        torch.manual_seed(0)
        with timm.set_scriptable(True):
            model, self.size = create_small(name)
        self.model = model.eval()

    @functools.cached_property
    def graph(self) -> torch.nn.Module:
        problem = _base_fx_problem(self.family)
        if problem:
            pytest.skip(problem)
        tracer_kwargs = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())
        with warnings.catch_warnings():  # torchvision warns that the modes differ: their nodes are given apart
            warnings.filterwarnings('ignore', 'The nodes obtained by tracing the model in train mode', UserWarning)
            train_nodes, eval_nodes = get_graph_node_names(self.model, tracer_kwargs=tracer_kwargs)
            graph = create_feature_extractor(
                self.model, train_return_nodes=train_nodes[-1:], eval_return_nodes=eval_nodes[-1:],
                tracer_kwargs=tracer_kwargs)
        return graph.eval()


@pytest.fixture(scope='module', params=_params(TIMM_EXT_MODELS))
def contract(request) -> _Contract:
    """Shared by the four contract tests of one model (pytest runs them together, one model in memory at a time)."""
    return _Contract(request.param)


def _only(outputs: Dict[str, torch.Tensor]) -> torch.Tensor:
    assert len(outputs) == 1
    return next(iter(outputs.values()))


def test_a_larger_sibling_has_the_classes_of_the_model_that_runs():
    """What makes a size a sibling: the same model class built of the same module classes (more or wider blocks), so
    the lanes that leave the larger out still run every class's code through the contract."""
    assert len(LARGER_SIBLINGS) == 21 and set(LARGER_SIBLINGS.values()).isdisjoint(LARGER_SIBLINGS)

    def classes(name):
        model = timm.create_model(name, device='meta')
        return type(model), {type(m) for m in model.modules()}

    for larger, smallest in LARGER_SIBLINGS.items():
        assert classes(larger) == classes(smallest), (larger, smallest)
    assert classes('alternet_34') != classes('alternet_50')  # basic blocks, bottlenecks: no siblings


def test_every_family_has_a_small_input():
    families = {model_entrypoint(n).__module__.rsplit('.', 1)[-1] for n in TIMM_EXT_MODELS}
    assert families == set(IMG_SIZE) | {'alternet', 'hdvw_baselines'} and len(TIMM_EXT_MODELS) == 41


def test_model_forward_fx(contract):
    x = torch.randn(1, *contract.size)
    with torch.inference_mode():
        out = contract.model(x)
        fx_out = _only(contract.graph(x))
    assert torch.equal(fx_out, out) and torch.isfinite(out).all()


def test_model_backward_fx(contract):
    graph = contract.graph.train()  # torchvision's dual-graph module switches graphs in train()/eval()
    try:
        out = _only(graph(torch.randn(2, *contract.size)))
        assert out.shape == (2, contract.model.num_classes) and torch.isfinite(out).all()
        out.mean().backward()
        params = dict(graph.named_parameters())
        assert len(params) == len(list(contract.model.parameters()))
        assert [n for n, p in params.items() if p.grad is None] == []
    finally:
        graph.eval().zero_grad(set_to_none=True)


@pytest.mark.filterwarnings(SCRIPT_WARNING)
def test_model_forward_torchscript(contract):
    x = torch.randn(1, *contract.size)
    scripted = torch.jit.script(contract.model)
    with torch.inference_mode():
        torch.testing.assert_close(scripted(x), contract.model(x))


@pytest.mark.filterwarnings(SCRIPT_WARNING)
def test_model_forward_fx_torchscript(contract):
    x = torch.randn(1, *contract.size)
    scripted = torch.jit.script(contract.graph)
    with torch.inference_mode():
        torch.testing.assert_close(_only(scripted(x)), contract.model(x))


# every pretrained tag of every model, as timm's test_model_default_cfgs takes list_models(include_tags=True)
TIMM_EXT_TAGS = timm.list_models(TIMM_EXT_MODELS, include_tags=True)
# timm's NON_STD_FILTERS that match our names: token outputs, no spatial pool_size (test_model_default_cfgs_non_std)
_NON_STD = ('vit_*', 'pit_*', '*mixer_*', 'volo_*')
_STD_TAGS = [n for n in TIMM_EXT_TAGS if not any(fnmatch.fnmatch(n, p) for p in _NON_STD)]
_NON_STD_TAGS = [n for n in TIMM_EXT_TAGS if n not in _STD_TAGS]


def _meta_model(name: str, **kwargs) -> torch.nn.Module:
    """The model of one pretrained tag on the meta device: timm's cfg checks are about shapes, so no compute."""
    return timm.create_model(name, pretrained=False, device='meta', **kwargs).eval()


def _check_cfg_layer_names(name: str, model: torch.nn.Module) -> None:
    """timm's check that the cfg's classifier and first_conv name parameters of the model."""
    cfg, state_dict = model.pretrained_cfg, model.state_dict()
    if cfg.get('num_classes'):
        classifier = cfg['classifier']
        for c in classifier if isinstance(classifier, (tuple, list)) else (classifier,):
            assert c + '.weight' in state_dict, f'{name}: classifier {c} not in model params'
    first_conv = cfg['first_conv']
    for c in (first_conv,) if isinstance(first_conv, str) else first_conv:
        assert c + '.weight' in state_dict, f'{name}: first_conv {c} not in model params'


def test_default_cfg_tags_are_split_as_timm_splits_them():
    assert len(TIMM_EXT_TAGS) >= len(TIMM_EXT_MODELS) and 'resnet50_cifar.hdvw_cifar100' in TIMM_EXT_TAGS
    assert {n.split('.')[0] for n in _STD_TAGS} == (
        set(timm.list_models('alternet_*')) | {'resnet50_cifar', 'swin_tiny_patch1_window4_32'})


@pytest.mark.parametrize('name', _STD_TAGS)
def test_model_default_cfgs(name):
    """timm's test_model_default_cfgs: the unpooled features are ``pool_size`` at the cfg's input size, with and
    without the classifier and the global pool; every spatial model's cfg must state its pool_size."""
    model = _meta_model(name)
    cfg = model.pretrained_cfg
    pool_size = cfg.get('pool_size')
    assert pool_size, f'{name}: the pretrained cfg has no pool_size (the feature map at input_size {cfg["input_size"]})'
    assert model.num_classes >= 0 and model.num_features > 0 and model.head_hidden_size > 0
    output_fmt = getattr(model, 'output_fmt', 'NCHW')
    spatial, feat = get_spatial_dim(output_fmt), get_channel_dim(output_fmt)
    x = torch.empty(1, *cfg['input_size'], device='meta')
    features = model.forward_features(x)
    pre_logits = model.forward_head(features, pre_logits=True)
    assert (features.shape[spatial[0]], features.shape[spatial[1]]) == tuple(pool_size)
    assert features.shape[feat] == model.num_features and pre_logits.shape[1] == model.head_hidden_size
    model.reset_classifier(0)
    assert model.num_classes == 0 and model(x).shape == pre_logits.shape
    model.reset_classifier(0, '')
    unpooled = model(x)
    assert unpooled.ndim == 4 and (unpooled.shape[spatial[0]], unpooled.shape[spatial[1]]) == tuple(pool_size)
    unpooled = _meta_model(name, num_classes=0, global_pool='')(x)
    assert unpooled.ndim == 4 and (unpooled.shape[spatial[0]], unpooled.shape[spatial[1]]) == tuple(pool_size)
    _check_cfg_layer_names(name, _meta_model(name))


@pytest.mark.parametrize('name', _NON_STD_TAGS)
def test_model_default_cfgs_non_std(name):
    """timm's test_model_default_cfgs_non_std: token models give num_features wide features and pre-logits."""
    model = _meta_model(name)
    assert model.num_classes >= 0 and model.num_features > 0 and model.head_hidden_size > 0
    x = torch.empty(1, *model.pretrained_cfg['input_size'], device='meta')
    features = model.forward_features(x)
    pre_logits = model.forward_head(features, pre_logits=True)
    assert features.shape[-1 if features.ndim == 3 else 1] == model.num_features
    assert pre_logits.shape[1] == model.head_hidden_size
    model.reset_classifier(0)
    assert model.num_classes == 0 and model(x).shape == pre_logits.shape
    assert _meta_model(name, num_classes=0)(x).shape[1] == model.num_features
    _check_cfg_layer_names(name, _meta_model(name))


# the registered names whose model is one of timm's own classes (with our arguments or stem)
_TIMM_CLASS_MODELS = {'vit_tiny_patch2_32', 'pit_ti_patch2_32', 'swin_tiny_patch1_window4_32', 'vit_tiny_convstem',
                      'vit_small_convstem', 'vit_base_convstem'}
# timm >= 1.0.29 builds the new classifier of its own models on the model's device and dtype; 1.0.23 ... 1.0.28 build
# it on torch's defaults (ResNet, ViT, Swin) or read them from the old head (PiT, VOLO, Mixer), gone after reset(0)
_TIMM_RESETS_LIKE_MODEL = Version(timm.__version__).release >= (1, 0, 29)


def _one_per_family(names):
    """The names as params, all but the first quick one of each family (entrypoint module; each of hdvw_baselines'
    names is a class of its own) marked slow, the larger siblings also ``larger_sibling``."""
    seen, params = set(), []
    for name in names:
        module = model_entrypoint(name).__module__
        family = name if module.endswith('hdvw_baselines') else module
        slow = any(fnmatch.fnmatch(name, p) for p in _SLOW) or family in seen
        seen |= set() if slow else {family}
        marks = ([pytest.mark.slow] if slow else []) + ([pytest.mark.larger_sibling] if name in LARGER_SIBLINGS else [])
        params.append(pytest.param(name, marks=marks))
    return params


@pytest.mark.parametrize('name', _one_per_family(TIMM_EXT_MODELS))
def test_reset_classifier_builds_on_the_models_dtype_and_mode(name):
    """timm 1.0.31's contract (its test_model_default_cfgs): after ``reset_classifier(0)`` then ``(5)`` the new
    classifier has the model's dtype and training mode, so a float64 model still runs. Every timm-ext class keeps it
    on every timm release. Release-aware only for the models of timm's own classes, because timm differs: there timm
    1.0.23 ... 1.0.28 build the head in float32 and the forward fails, as for timm's own models."""
    torch.manual_seed(0)
    model, size = create_small(name)
    ours = type(model).__module__.startswith('timm_ext.')
    assert ours is (name not in _TIMM_CLASS_MODELS)
    model = model.to(torch.float64).eval()
    model.reset_classifier(0)
    model.reset_classifier(5)
    heads = model.get_classifier()
    dtypes = {p.dtype for head in (heads if isinstance(heads, (tuple, list)) else (heads,)) for p in head.parameters()}
    x = torch.randn(2, *size, dtype=torch.float64)
    with torch.no_grad():
        if ours or _TIMM_RESETS_LIKE_MODEL:
            assert dtypes == {torch.float64}
            out = model(x)
            assert out.shape == (2, 5) and out.dtype == torch.float64
        else:
            assert dtypes == {torch.float32}
            with pytest.raises(RuntimeError, match='dtype'):
                model(x)
    if ours:
        assert not any(m.training for m in model.modules())
        model.train().reset_classifier(3, '' if isinstance(model, AlterNet) else None)
        assert all(m.training for m in model.modules())
        model.to('meta').reset_classifier(0)  # and the device: timm's test builds on the meta device
        model.reset_classifier(2)
        assert all(p.device.type == 'meta' for p in model.parameters())


@pytest.mark.parametrize('name', TIMM_EXT_MODELS)
def test_no_weight_decay(name):
    """Every model names the parameters to keep out of weight decay; CB_S's Lambda is among them."""
    model, _ = create_small(name, device='meta')
    names = model.no_weight_decay()
    assert isinstance(names, set)
    assert {n for n, _ in model.named_parameters() if n.endswith('.cb.gamma')} <= names
    if 'cbs' in name:
        assert any(n.endswith('.cb.gamma') for n in names)


def test_no_weight_decay_of_cbs_mixer_and_pit():
    for name in ('mixer_s16_cb', 'pit_b_cb'):
        model = timm.create_model(name, cb_scaled=True, cb_layers=[1], device='meta')
        expected = {n for n, _ in model.named_parameters() if n.endswith('cb.gamma')}
        assert len(expected) == 1 and expected <= model.no_weight_decay()


def _attention_by_hand(attn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) of timm's Attention from its qkv weights: the maps AttentionExtract must return."""
    B, N, C = x.shape
    qkv = torch.nn.functional.linear(x, attn.qkv.weight, attn.qkv.bias).view(B, N, 3, attn.num_heads, -1)
    q, k, _ = qkv.permute(2, 0, 3, 1, 4)
    return ((q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5).softmax(-1)


@pytest.mark.parametrize('name', ['vit_tiny_cb', 'vit_tiny_cbs', 'vit_tiny_cb_all', 'vit_tiny_convstem'])
def test_attention_extract_default_mode(name):
    """timm.utils.AttentionExtract in its default mode (FX, '*attn.softmax') returns every block's map."""
    model, size = create_small(name, depth=3)
    for blk in model.blocks:
        blk.attn.fused_attn = False  # timm's route to an explicit softmax for AttentionExtract (base ViTs alike)
    x = torch.randn(2, *size)
    inputs = []
    hooks = [blk.attn.register_forward_pre_hook(lambda _, args: inputs.append(args[0])) for blk in model.blocks]
    with torch.no_grad():
        model.eval()(x)
        maps = AttentionExtract(model)(x)
    for h in hooks:
        h.remove()
    assert list(maps) == [f'blocks.{i}.attn.softmax' for i in range(3)]
    for i, blk in enumerate(model.blocks):
        torch.testing.assert_close(maps[f'blocks.{i}.attn.softmax'], _attention_by_hand(blk.attn, inputs[i]))


CB_MODELS = timm.list_models(module=['vision_transformer_cb', 'pit_cb', 'mlp_mixer_cb'])
# one model per class and CB variant for the heavier checks
REPRESENTATIVES = ['vit_tiny_cb', 'vit_tiny_cbs', 'pit_b_cb', 'mixer_s16_cb']
IMG = 64
# narrower PiT for the heavier checks: same classes and code paths, a tenth of the compute
SHRINK = {'pit_b_cb': dict(base_dims=[32, 32, 32], heads=[2, 4, 8])}
_cache = {}


def _create(name, **kwargs):
    return timm.create_model(name, img_size=IMG, **SHRINK.get(name, {}), **kwargs)


def _model(name):
    if name not in _cache:
        _cache[name] = _create(name).eval()
    return _cache[name]


def _x(batch=2, chans=3):
    return torch.randn(batch, chans, IMG, IMG)


def test_all_cb_models_are_registered_and_listed():
    assert set(timm.list_models('*_cb*')) >= {
        'vit_tiny_cb', 'vit_small_cb', 'vit_base_cb', 'vit_tiny_cb_all', 'vit_small_cb_all', 'vit_base_cb_all',
        'pit_b_cb', 'mixer_s16_cb'}
    assert set(timm.list_models('*_cbs')) == {'vit_tiny_cbs', 'vit_small_cbs', 'vit_base_cbs'}
    assert len(CB_MODELS) == 11


@pytest.mark.parametrize('name', [pytest.param(n, marks=[pytest.mark.larger_sibling] if n in LARGER_SIBLINGS else [])
                                  for n in CB_MODELS])
def test_create_forward_backward_and_pretrained_cfg(name):
    model = timm.create_model(name, img_size=IMG, num_classes=7)
    out = model(_x())
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    cfg = model.pretrained_cfg
    assert cfg['architecture'] == name and cfg['num_classes'] == 1000 and cfg['paper_ids'] == 'arXiv:2210.08457'
    assert timm.get_pretrained_cfg(name) is not None


@pytest.mark.parametrize('name', REPRESENTATIVES)
def test_forward_head_pre_logits_and_reset_classifier(name):
    model = copy.deepcopy(_model(name))
    x = _x()
    with torch.no_grad():
        feats = model.forward_features(x)
        pre = model.forward_head(feats, pre_logits=True)
        assert pre.shape == (2, model.num_features)
        torch.testing.assert_close(model.forward_head(feats), model.get_classifier()(pre))
        model.reset_classifier(10)
        assert model(x).shape == (2, 10)
        model.reset_classifier(0)
        assert model(x).shape == (2, model.num_features)


BASE_OF = {'vit_tiny_cb': 'vit_tiny_patch16_224', 'vit_tiny_cbs': 'vit_tiny_patch16_224',
           'pit_b_cb': 'pit_b_224', 'mixer_s16_cb': 'mixer_s16_224'}


@pytest.mark.parametrize('name', REPRESENTATIVES)
def test_features_only_same_as_timm_base_model(name):
    model = _create(name, features_only=True).eval()
    base = timm.create_model(BASE_OF[name], img_size=IMG, features_only=True, **SHRINK.get(name, {})).eval()
    x = _x()
    with torch.no_grad():
        assert [f.shape for f in model(x)] == [f.shape for f in base(x)]
    assert model.feature_info.channels() == base.feature_info.channels()
    assert model.feature_info.reduction() == base.feature_info.reduction()
    assert [f.shape[1] for f in model(x)] == model.feature_info.channels()


def test_vit_feature_reduction_is_the_patch_size():
    model = timm.create_model('vit_tiny_cb', img_size=IMG, features_only=True)
    assert [IMG // f.shape[-1] for f in model(_x())] == model.feature_info.reduction() == [16, 16, 16]


@pytest.mark.parametrize('name', ['vit_tiny_cb', 'vit_tiny_cbs', 'mixer_s16_cb'])
def test_forward_intermediates_matches_forward_features(name):
    model = _model(name)
    x = _x()
    with torch.no_grad():
        final, inter = model.forward_intermediates(x, indices=[5, 7])
        torch.testing.assert_close(final, model.forward_features(x))
        assert len(inter) == 2 and inter[0].ndim == 4 and inter[0].shape[-1] == IMG // 16


def test_forward_intermediates_pit():
    model = _model('pit_b_cb')
    with torch.no_grad():
        final, inter = model.forward_intermediates(_x())
    assert [t.shape[1] for t in inter] == [64, 128, 256]


@pytest.mark.parametrize('name', REPRESENTATIVES)
def test_grad_checkpointing_gives_same_gradients(name):
    model = copy.deepcopy(_model(name)).train()
    x = _x()
    model(x).sum().backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], msg=n)


@pytest.mark.parametrize('name', REPRESENTATIVES)
def test_in_chans_and_group_matcher(name):
    model = _create(name, in_chans=1)
    assert model(_x(chans=1)).shape == (2, 1000)
    groups = timm.models.group_parameters(model, model.group_matcher())
    assert sum(len(v) for v in groups.values()) == len(list(model.named_parameters()))


@pytest.mark.slow
def test_torch_compile_forward_matches_eager():
    model = timm.create_model('vit_tiny_cbs', img_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
