"""MESA (Du et al., NeurIPS 2022): the KL term against the paper's formula, the optimizer and the own-loop shape
against a loop written here from the paper (EMA and loss by hand, torch only), start_step, resume, bad settings,
timm's factory names, and (slow) timm's real train.py."""
import copy
import subprocess
import sys

import pytest
import timm.task
import torch
import torch.nn as nn
import torch.nn.functional as F
from _sam_reference import flat, images, mlp, tiny_vit
from _timm_train import TRAIN_PY
from conftest import require_timm_script
from timm.optim import create_optimizer_v2
from timm.task import ClassificationTask

from timm_ext.launch.build_command import child_env
from timm_ext.optim import SAM_BASES
from timm_ext.optim.mesa import MESALoss, mesa_kl
from timm_ext.optim.mesa_optimizer import MESA, mesa_kwargs_problems, register_mesa_optimizers


@pytest.fixture(scope='module', autouse=True)
def registered():
    register_mesa_optimizers()  # idempotent: import timm_ext registered them already


# ---- the reference: the paper's loss and a ModelEmaV2-style average, written out -----------------------

def paper_kl(z: torch.Tensor, z_ema: torch.Tensor, t: float) -> torch.Tensor:
    """T^2 KL(softmax(z_ema / T) || softmax(z / T)): summed over classes, averaged over the batch."""
    q = torch.softmax(z_ema / t, dim=1)
    p = torch.softmax(z / t, dim=1)
    return t ** 2 * (q * (q.log() - p.log())).sum(dim=1).mean()


def reference(model, data, kl_weight, t=5.0, decay=0.5, start=0, lr=0.1):
    """SGD (momentum 0.9) on cross-entropy + kl_weight * paper_kl from step ``start`` on, the EMA (eval mode) of
    every float weight and buffer moved after each step, integer buffers copied; final flat weights and EMA."""
    model, ema = copy.deepcopy(model), copy.deepcopy(model).eval()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step, (x, y) in enumerate(data):
        z = model(x)
        loss = F.cross_entropy(z, y)
        if step >= start and kl_weight:
            with torch.no_grad():
                z_ema = ema(x)
            loss = loss + kl_weight * paper_kl(z, z_ema, t)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for e, m in zip(ema.state_dict().values(), model.state_dict().values()):
                e.copy_(decay * e + (1 - decay) * m if e.is_floating_point() else m)
    return flat(model.parameters()).detach(), ema.state_dict()


def task_loop(model, opt, data, task=None):
    """train.py's update: ``task(input, target)['loss']``, backward, ``optimizer.step()`` (no closure)."""
    task = task or ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    for x, y in data:
        task(x, y)['loss'].backward()
        opt.step()
        opt.zero_grad()
    return flat(model.parameters()).detach()


def own_loop(model, mesa, opt, data):
    """The loop-of-your-own shape: cross-entropy + ``mesa(x, z)``, step, ``mesa.update()``."""
    for x, y in data:
        z = model(x)
        (F.cross_entropy(z, y) + mesa(x, z)).backward()
        opt.step()
        opt.zero_grad()
        mesa.update()
    return flat(model.parameters()).detach()


def models():
    """A tiny timm ViT, and an MLP with BatchNorm (eval-mode EMA, averaged running stats, copied counter)."""
    data_vit = [(x.double(), y) for x, y in images(4)]
    g = torch.Generator().manual_seed(5)
    data_mlp = [(torch.randn(8, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (8,), generator=g))
                for _ in range(4)]
    return {'vit': (tiny_vit().double(), data_vit), 'mlp-bn': (mlp(bn=True).double(), data_mlp)}


MODELS = ['vit', 'mlp-bn']


def assert_same_ema(ema: nn.Module, expected: dict) -> None:
    state = ema.state_dict()
    assert list(state) == list(expected)
    for key in expected:
        torch.testing.assert_close(state[key], expected[key], rtol=1e-9, atol=1e-12, msg=key)


# ---- (i) the term --------------------------------------------------------------------------------------

def test_the_kl_term_is_the_papers_formula_and_its_gradient():
    g = torch.Generator().manual_seed(0)
    z = (3 * torch.randn(6, 10, generator=g, dtype=torch.float64)).requires_grad_()
    z_ema = 3 * torch.randn(6, 10, generator=g, dtype=torch.float64)
    for t in (1.0, 5.0):
        value = mesa_kl(z, z_ema, t)
        torch.testing.assert_close(value, paper_kl(z, z_ema, t), rtol=1e-12, atol=0)
        (grad,) = torch.autograd.grad(value, z)
        # d/dz of T^2 KL(q || softmax(z/T)), averaged over the batch: T (softmax(z/T) - q) / B
        expected = t * (torch.softmax(z / t, 1) - torch.softmax(z_ema / t, 1)) / z.shape[0]
        torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-14)
    assert mesa_kl(z_ema, z_ema, 5.0).abs().item() < 1e-12


def test_mesa_loss_distils_from_an_eval_mode_copy():
    model, data = models()['mlp-bn']
    mesa = MESALoss(model, kl_weight=0.8)
    copied = copy.deepcopy(model).eval()  # the model as MESALoss copied it
    x = data[0][0]
    z = model(x)  # train mode: batch statistics (and the model's running statistics move)
    with torch.no_grad():
        z_ema = copied(x)  # the copy: its running statistics
    torch.testing.assert_close(mesa(x, z), 0.8 * paper_kl(z, z_ema, 5.0), rtol=1e-12, atol=0)
    assert mesa.ema.module is not model and not mesa.ema.module.training and model.training


# ---- (ii) kl_weight 0 is the base optimizer ------------------------------------------------------------

def test_kl_weight_zero_is_exactly_the_base_optimizer():
    base, data = models()['vit']
    plain = copy.deepcopy(base)
    expected = task_loop(plain, torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9), data)
    ours = copy.deepcopy(base)
    opt = MESA(torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9), kl_weight=0.0)
    assert torch.equal(task_loop(ours, opt, data), expected)
    assert opt.term.updates == len(data)  # the EMA still moved every step
    own = copy.deepcopy(base)
    sgd = torch.optim.SGD(own.parameters(), lr=0.1, momentum=0.9)
    assert torch.equal(own_loop(own, MESALoss(own, kl_weight=0.0), sgd, data), expected)


# ---- (iii) and (iv) against the hand-written loop, start_step included ---------------------------------

@pytest.mark.parametrize('start', [0, 2])
@pytest.mark.parametrize('which', MODELS)
def test_own_loop_shape_equals_the_hand_written_loop(which, start):
    base, data = models()[which]
    expected, expected_ema = reference(base, data, kl_weight=0.8, start=start)
    model = copy.deepcopy(base)
    mesa = MESALoss(model, kl_weight=0.8, temperature=5.0, ema_decay=0.5, start_step=start)
    got = own_loop(model, mesa, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), data)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12)
    assert_same_ema(mesa.ema.module, expected_ema)
    start_w = flat(base.parameters()).detach()
    plain, _ = reference(base, data, kl_weight=0.0)
    assert (got - plain).norm() > 1e-3 * (plain - start_w).norm()  # the term really changes the steps


@pytest.mark.parametrize('which', MODELS)
def test_optimizer_over_timms_task_equals_the_hand_written_loop(which):
    base, data = models()[which]
    expected, expected_ema = reference(base, data, kl_weight=0.8, start=1)
    model = copy.deepcopy(base)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)  # train.py: the task, then the optimizer
    opt = create_optimizer_v2(model, 'mesasgd', lr=0.1, momentum=0.9, nesterov=False, kl_weight=0.8,
                              temperature=5.0, ema_decay=0.5, start_step=1)
    assert isinstance(opt, MESA) and type(opt.base_optimizer) is torch.optim.SGD
    torch.testing.assert_close(task_loop(model, opt, data, task), expected, rtol=1e-9, atol=1e-12)
    assert opt.term.model is model and opt.term.updates == len(data)
    assert_same_ema(opt.term.ema.module, expected_ema)


def test_start_step_leaves_the_first_updates_plain():
    base, data = models()['mlp-bn']
    plain = copy.deepcopy(base)
    sgd = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    ours = copy.deepcopy(base)
    opt = MESA(torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9), kl_weight=0.8, ema_decay=0.5, start_step=2)
    task = ClassificationTask(ours, nn.CrossEntropyLoss(), verbose=False)
    for step, (x, y) in enumerate(data[:3]):
        before = task_loop(plain, sgd, [(x, y)])
        after = task_loop(ours, opt, [(x, y)], task)
        assert torch.equal(after, before) == (step < 2), step  # identical for 2 updates, different at the third


# ---- (vi) resume ------------------------------------------------------------------------------------------

@pytest.mark.parametrize('load', ['before the task runs', 'after the task ran'])
def test_state_dict_restores_the_ema_and_the_next_steps(load, tmp_path):
    base, data = models()['mlp-bn']
    kwargs = dict(lr=0.1, kl_weight=0.8, ema_decay=0.5, start_step=1)
    model = copy.deepcopy(base)
    opt = create_optimizer_v2(model, 'mesamomentum', **kwargs)
    task_loop(model, opt, data[:2])
    torch.save({'model': model.state_dict(), 'optimizer': opt.state_dict()}, tmp_path / 'last.pth')
    expected = task_loop(model, opt, data[2:])  # the uninterrupted run
    expected_ema = opt.term.ema.module.state_dict()

    checkpoint = torch.load(tmp_path / 'last.pth', weights_only=True)
    resumed = copy.deepcopy(base)
    resumed.load_state_dict(checkpoint['model'])
    task = ClassificationTask(resumed, nn.CrossEntropyLoss(), verbose=False)
    again = create_optimizer_v2(resumed, 'mesamomentum', **kwargs)
    if load == 'after the task ran':
        with torch.no_grad():
            task.eval()(*data[0])  # binds (no term without gradients; eval: the running statistics stay)
        task.train()
        assert again.term is not None and again.term.updates == 0
    again.load_state_dict(checkpoint['optimizer'])
    assert torch.equal(task_loop(resumed, again, data[2:], task), expected)
    assert again.term.updates == 4
    for key, value in expected_ema.items():
        assert torch.equal(again.term.ema.module.state_dict()[key], value), key


def test_a_newer_mesa_over_the_same_parameters_takes_the_task():
    model, data = models()['mlp-bn']
    old = MESA(torch.optim.SGD(model.parameters(), lr=0.1), kl_weight=0.8)
    new = MESA(torch.optim.SGD(model.parameters(), lr=0.1), kl_weight=0.8)
    task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
    x, y = data[0]
    ema = copy.deepcopy(model).eval()  # the model as the binding copies it (the call moves its running statistics)
    loss = task(x, y)['loss']
    assert new.term is not None and old.term is None and old.binding.state.value == 'closed'
    with torch.no_grad():
        expected = F.cross_entropy(model(x), y) + 0.8 * paper_kl(model(x), ema(x), 5.0)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)  # one term, not two


# ---- (v) bad settings and refusals ------------------------------------------------------------------------

BAD = [
    (dict(kl_weight=-1), r'^MESA kl_weight must be >= 0, got kl_weight=-1$'),
    (dict(kl_weight=float('nan')), r'^MESA kl_weight must be >= 0, got kl_weight=nan$'),
    (dict(temperature=0), r'^MESA temperature must be > 0, got temperature=0$'),
    (dict(temperature='5'), r"^MESA temperature must be > 0, got temperature='5'$"),
    (dict(ema_decay=1.0), r'^MESA ema_decay must be in \[0, 1\), got ema_decay=1.0$'),
    (dict(ema_decay=-0.1), r'^MESA ema_decay must be in \[0, 1\), got ema_decay=-0.1$'),
    (dict(start_step=1.5), r'^MESA start_step must be an integer >= 0, got start_step=1.5$'),
    (dict(start_step=-1), r'^MESA start_step must be an integer >= 0, got start_step=-1$'),
    (dict(start_step=True), r'^MESA start_step must be an integer >= 0, got start_step=True$'),
]


@pytest.mark.parametrize('kwargs, match', BAD)
@pytest.mark.parametrize('shape', ['MESA', 'MESALoss', 'factory'])
def test_bad_settings_are_one_line(shape, kwargs, match):
    model = mlp()
    build = {'MESA': lambda: MESA(model.parameters(), torch.optim.SGD, lr=0.1, **kwargs),
             'MESALoss': lambda: MESALoss(model, **kwargs),
             'factory': lambda: create_optimizer_v2(model, 'mesasgd', lr=0.1, **kwargs)}[shape]
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize('opt, kwargs', [('mesasgd', kwargs) for kwargs, _ in BAD] + [
    ('mesa', dict(base='nope')), ('lookahead_mesasgd', dict(kl_weight=-1)), ('mesa', dict(base='sam', start_step=-1))])
def test_recipe_check_finds_what_the_factory_would_raise(opt, kwargs):
    """``mesa_kwargs_problems`` (for a recipe check, before train.py builds anything): the factory's own lines."""
    with pytest.raises(ValueError) as raised:
        create_optimizer_v2(mlp(), opt, lr=0.1, **kwargs)
    problems = mesa_kwargs_problems(opt, kwargs)
    assert problems[0] == str(raised.value) and len(problems) == 1 + ('base' in kwargs and len(kwargs) > 1)


def test_recipe_check_passes_good_settings_and_other_optimizers():
    assert mesa_kwargs_problems('mesaadamw', dict(kl_weight=0.8, temperature=5.0, ema_decay=0.99, start_step=200)) == []
    assert mesa_kwargs_problems('mesa', dict(base='lamb')) == []
    assert mesa_kwargs_problems('adamw', dict(kl_weight=-1)) == [] == mesa_kwargs_problems('samadamw', dict(rho=-1))


def test_bad_base_and_keyword_are_one_line():
    model = mlp()
    with pytest.raises(ValueError, match=r"^Unknown base optimizer 'nope' for MESA; valid names: .*adamw"):
        create_optimizer_v2(model, 'mesa', base='nope', lr=0.1)
    with pytest.raises(ValueError, match=r"^Unknown base optimizer 'mesasgd' for MESA"):
        create_optimizer_v2(model, 'mesa', base='mesasgd', lr=0.1)
    with pytest.raises(TypeError, match=r"^MESA got an unexpected keyword argument 'kl_wieght': did you mean "
                                        r"'kl_weight' \(a MESA setting\)\?$"):
        create_optimizer_v2(model, 'mesasgd', lr=0.1, kl_wieght=0.5)


def test_a_wrapper_as_base_is_refused():
    model = mlp()
    with pytest.raises(ValueError, match=r'^MESA cannot wrap MESA, an optimizer that wraps another: wrap its base '
                                         r'optimizer$'):
        MESA(MESA(torch.optim.SGD(model.parameters(), lr=0.1)))
    with pytest.raises(ValueError, match=r'^SAM cannot wrap another SAM optimizer$'):
        MESA(create_optimizer_v2(model, 'samsgd', lr=0.1))


def test_step_without_the_task_and_other_tasks_are_refused():
    model, data = models()['mlp-bn']
    opt = MESA(torch.optim.SGD(model.parameters(), lr=0.1))
    F.cross_entropy(model(data[0][0]), data[0][1]).backward()
    with pytest.raises(RuntimeError, match=r'^MESA\.step\(\): no timm ClassificationTask holding this optimizer\'s '
                                           r'parameters has run.*use MESALoss in a loop of your own$'):
        opt.step()


@pytest.mark.skipif(not hasattr(timm.task, 'MultiLabelClassificationTask'),
                    reason='this timm (1.0.23) has no MultiLabelClassificationTask to refuse')
def test_a_multi_label_task_is_refused():
    model, data = models()['mlp-bn']
    opt = MESA(torch.optim.SGD(model.parameters(), lr=0.1))  # waits for its task while it lives
    multi = timm.task.MultiLabelClassificationTask(model, verbose=False)
    with pytest.raises(ValueError, match=r'^MESA adds a softmax KL over the logits of timm\'s single-label '
                                         r'ClassificationTask, got MultiLabelClassificationTask'):
        multi(data[0][0], torch.zeros(8, 3, dtype=torch.float64))
    assert opt.term is None  # refused: no task bound


# ---- timm's factory -------------------------------------------------------------------------------------

@pytest.mark.parametrize('base', SAM_BASES)
def test_every_combined_name_wraps_the_base_timm_builds(base):
    model = mlp()
    opt = create_optimizer_v2(model, 'mesa' + base, lr=1e-3, kl_weight=0.3)
    plain = create_optimizer_v2(model, base, lr=1e-3)
    assert isinstance(opt, MESA) and opt.kl_weight == 0.3
    assert type(opt.base_optimizer) is type(plain)
    assert opt.base_optimizer.defaults == plain.defaults


def test_bare_name_takes_any_base():
    model = mlp()
    assert type(create_optimizer_v2(model, 'mesa', lr=1e-3).base_optimizer) is torch.optim.AdamW
    bare = create_optimizer_v2(model, 'mesa', base='sgd', lr=1e-3)
    assert bare.base_optimizer.defaults == create_optimizer_v2(model, 'sgd', lr=1e-3).defaults


# ---- timm's real train.py ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_in_train_py_it_equals_the_same_mesa_driven_by_hand(tmp_path):
    """train.py builds mesaadamw from opt/opt_kwargs, MESA finds its task; the demo's built-in loop (timm's parts
    by hand) gives the same summary.csv, number for number, and plain AdamW another one."""
    from _train_py_routes import both_routes

    loop, train_py = both_routes(tmp_path / 'mesa', 'mesaadamw', dict(kl_weight=0.8, ema_decay=0.99, start_step=2))
    assert loop == train_py and len(loop.splitlines()) == 3
    _, plain = both_routes(tmp_path / 'plain', 'adamw', {}, loop=False)
    assert plain.splitlines()[0] == train_py.splitlines()[0]
    assert plain.splitlines()[1:] != train_py.splitlines()[1:]  # the term reached train.py's loss


@pytest.mark.slow
def test_train_py_resume_continues_the_run_bit_for_bit(tmp_path):
    """Three epochs of train.py, and the same run resumed from its epoch-1 checkpoint: the same weights, the same
    EMA and update count in the optimizer's state (loaded before MESA finds its task)."""
    import numpy as np
    import yaml
    from PIL import Image

    require_timm_script(TRAIN_PY)
    rng = np.random.default_rng(0)
    for split, count in (('train', 12), ('validation', 2)):
        for cls in range(2):
            (tmp_path / 'data' / split / f'c{cls}').mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                pixels[..., cls] = 255
                Image.fromarray(pixels).save(tmp_path / 'data' / split / f'c{cls}' / f'{i}.png')
    recipe = dict(device_modules=['timm_ext'], opt='mesaadamw', lr=1e-3, sched='cosine', epochs=3, seed=0,
                  opt_kwargs=dict(kl_weight=0.8, ema_decay=0.9, start_step=3))
    (tmp_path / 'mesa.yaml').write_text(yaml.safe_dump(recipe))

    def train(out, *args):
        done = subprocess.run(
            [sys.executable, str(TRAIN_PY), '-c', str(tmp_path / 'mesa.yaml'), '--data-dir', str(tmp_path / 'data'),
             '--model', 'test_resnet', '--num-classes', '2', '--img-size', '32', '--batch-size', '4', '--device',
             'cpu', '--workers', '0', '--warmup-epochs', '0', '--output', str(tmp_path / out), '--experiment', 'run',
             '--checkpoint-hist', '3', *args],
            env=dict(child_env(), HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1'), capture_output=True, text=True,
            timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
        return torch.load(tmp_path / out / 'run' / 'last.pth.tar', map_location='cpu', weights_only=False)

    full = train('full')
    resumed = train('resumed', '--resume', str(tmp_path / 'full' / 'run' / 'checkpoint-1.pth.tar'))
    assert full['epoch'] == resumed['epoch'] == 2
    for key, value in full['state_dict'].items():
        assert torch.equal(resumed['state_dict'][key], value), key
    ours, theirs = resumed['optimizer']['mesa'], full['optimizer']['mesa']
    assert ours['updates'] == theirs['updates'] == 18  # 3 epochs of 6 updates
    for key, value in theirs['ema'].items():
        assert torch.equal(ours['ema'][key], value), key
