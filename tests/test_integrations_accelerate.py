"""SAM driven by Hugging Face Accelerate (the real package), each setting measured against an independent
torch-only SAM reference: the closure loop through ``accelerator.prepare``, gradient accumulation (the natural
closure loop refused, the documented first_step/replay pattern exact), 2 processes (gloo) against 1 on the
global batch, bf16 autocast, fp16 (a scaler refused with a closure); each refusal's line, weights untouched;
save_state/load_state halfway (the checkpoint's SAM settings and update count win); accelerator.clip_grad_norm_
in the closure (SAM's clip_grad) and clip_grad_value_ (not SAM's clip_mode='value')."""
import itertools
import logging
import os

import pytest

pytest.importorskip('accelerate', reason='the Accelerate integration tests need accelerate (pip install accelerate)')

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _sam_reference import at, batches, flat, mlp, spawn_gloo  # noqa: E402
from _sam_reference import closure as closure_of  # noqa: E402
from accelerate import Accelerator, DataLoaderConfiguration  # noqa: E402
from accelerate.optimizer import AcceleratedOptimizer  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from timm.optim import create_optimizer_v2  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import timm_ext  # noqa: E402, F401  (registers samadamw)
from timm_ext.integrations.accelerate import (  # noqa: E402
    ACCELERATE_ACCUMULATION,
    ACCELERATE_FP16,
    accelerate_problem,
)
from timm_ext.optim import framework_checks  # noqa: E402

LR, RHO = 1e-2, 0.05
DATA = batches(4)  # 4 global batches of 8: one SAM update each
X, Y = torch.cat([x for x, _ in DATA]), torch.cat([y for _, y in DATA])


@pytest.fixture(autouse=True)
def _fresh_accelerate():
    """Accelerate keeps process-wide singletons (AcceleratorState, GradientState): each test its own, and none
    left behind for later test files (as accelerate's own AccelerateTestCase does)."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _loader(batch_size):
    return DataLoader(TensorDataset(X, Y), batch_size=batch_size, shuffle=False)


def _sam(model, **settings):
    return create_optimizer_v2(model, 'samadamw', lr=LR, **{'rho': RHO, **settings})


def _loss(model, x, y, bf16=False):
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16):
        out = model(x)
    return F.cross_entropy(out.float(), y)


def _reference(bf16=False, interval=1, clip=None, clip_first=False):
    """SAM by hand (torch only): per global batch, g at w, h at w + rho g / ||g|| (one flat vector, the mean loss
    over the batch), and torch's AdamW steps from w with h. ``interval``: a SAM update every interval-th, a plain
    one (h = g) in between. ``clip`` (a function of the flat vector) clips h, and g before the perturbation too
    with ``clip_first`` (what a clip inside the closure does)."""
    model = mlp()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0)  # the factory's samadamw: weight_decay 0
    for t, (x, y) in enumerate(DATA):
        w = flat(params).detach()
        g = flat(torch.autograd.grad(_loss(model, x, y, bf16), params))
        if t % interval == 0:
            d = clip(g) if clip_first else g
            perturbed = at(model, w + RHO * d / d.norm())
            h = flat(torch.autograd.grad(_loss(perturbed, x, y, bf16), list(perturbed.parameters())))
        else:
            h = g
        if clip is not None:
            h = clip(h)
        offset = 0
        for p in params:
            p.grad = h[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step()
        opt.zero_grad()
    return flat(params).detach()


def _plain_closure_loop(bf16=False):
    """The closure loop without Accelerate (the documented way 2)."""
    model = mlp()
    opt = _sam(model)
    for x, y in _loader(8):
        def closure(x=x, y=y):
            opt.zero_grad()
            loss = _loss(model, x, y, bf16)
            loss.backward()
            return loss
        opt.step(closure)
    return flat(model.parameters()).detach()


def _accelerate_closure_loop(accelerator, model, optimizer, loader, clip=None):
    """The natural closure loop under Accelerate: the closure back-propagates with accelerator.backward (then
    calls ``clip()``, e.g. accelerator.clip_grad_norm_, when given)."""
    for x, y in loader:
        with accelerator.accumulate(model):
            def closure(x=x, y=y):
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                accelerator.backward(loss)
                if clip is not None:
                    clip()
                return loss
            optimizer.step(closure)


def _accelerate_window_loop(accelerator, model, sam, optimizer, loader):
    """The documented accumulation pattern: keep the window, and at sync first_step, replay, step."""
    window = []
    for x, y in loader:
        with accelerator.accumulate(model):
            accelerator.backward(F.cross_entropy(model(x), y))
            window.append((x, y))
            if accelerator.sync_gradients:
                sam.first_step()  # w -> w + e with the window's gradient
                for xb, yb in window:  # the window again, at w + e
                    accelerator.backward(F.cross_entropy(model(xb), yb))
                window.clear()
            optimizer.step()  # Accelerate calls sam.step() at sync only: back to w, AdamW's step
            optimizer.zero_grad()


def _weights(model):
    return flat(model.parameters()).detach().clone()


def _max_diff(a, b):
    return (a - b).abs().max().item()


# ---- 1. plain ----------------------------------------------------------------------------------------------

def test_prepared_closure_loop_equals_plain_closure_loop():
    accelerator = Accelerator(cpu=True)
    model = mlp()
    sam = _sam(model)
    model, optimizer, loader = accelerator.prepare(model, sam, _loader(8))
    assert isinstance(optimizer, AcceleratedOptimizer) and optimizer.optimizer is sam
    _accelerate_closure_loop(accelerator, model, optimizer, loader)
    got, plain, ref = _weights(model), _plain_closure_loop(), _reference()
    assert _max_diff(got, plain) == 0.0  # bit for bit
    assert _max_diff(got, ref) <= 1e-6
    assert _max_diff(got, flat(mlp().parameters())) > 1e-2  # it trained


# ---- 2. accumulation with the natural closure loop: refused -------------------------------------------------

def test_accumulation_closure_loop_is_refused_before_the_first_update():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = mlp()
    model, optimizer, loader = accelerator.prepare(model, _sam(model), _loader(4))
    before = _weights(model)
    with pytest.raises(ValueError) as e:
        _accelerate_closure_loop(accelerator, model, optimizer, loader)
    assert str(e.value) == ACCELERATE_ACCUMULATION.format(steps=2)
    assert 'gradient_accumulation_steps=2' in str(e.value) and 'first_step()' in str(e.value)
    assert '\n' not in str(e.value)
    assert torch.equal(_weights(model), before) and not optimizer.state  # nothing stepped


def test_accumulation_closure_loop_unrefused_is_sam_on_the_last_micro_batch(monkeypatch):
    """Why the refusal: without it the update is silently SAM on each window's last micro-batch."""
    assert accelerate_problem in framework_checks._closure_checks  # registered when Accelerate was imported
    monkeypatch.setattr(framework_checks, '_closure_checks',
                        [check for check in framework_checks._closure_checks if check is not accelerate_problem])
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = mlp()
    model, optimizer, loader = accelerator.prepare(model, _sam(model), _loader(4))
    _accelerate_closure_loop(accelerator, model, optimizer, loader)
    assert _max_diff(_weights(model), _reference()) > 1e-2  # measured: 0.057 after 4 updates


class _Probe(torch.optim.SGD):
    """A stand-in optimizer that records, in its step, what accelerate_problem says about the caller."""
    _step_supports_amp_scaling = True  # as SAM: GradScaler.step calls step() itself

    def __init__(self):
        self.param = torch.nn.Parameter(torch.zeros(2))
        self.param.grad = torch.zeros(2)  # a (finite) gradient for the scaler's inf check
        super().__init__([self.param], lr=0.1)
        self.seen = []

    def step(self, closure=None):
        self.seen.append(accelerate_problem(closure, self))


def test_accumulation_message_unit():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    probe = _Probe()
    optimizer = accelerator.prepare(probe)
    optimizer.step(lambda: None)  # sync_gradients: the wrapper calls the optimizer
    assert probe.seen == [ACCELERATE_ACCUMULATION.format(steps=3)]
    assert 'gradient_accumulation_steps=3' in probe.seen[0] and '\n' not in probe.seen[0]
    accelerator.gradient_accumulation_steps = 1
    optimizer.step(lambda: None)
    assert probe.seen[1:] == [None]


def test_outside_accelerate_a_closure_loop_is_not_refused():
    """Accelerate's GradientState is process-wide: an Accelerator with accumulation does not make a closure loop
    that Accelerate does not drive look like its own."""
    Accelerator(cpu=True, gradient_accumulation_steps=2)
    assert GradientState().num_steps == 2
    assert accelerate_problem(lambda: None, _sam(mlp())) is None
    assert _max_diff(_plain_closure_loop(), _reference()) <= 1e-6


# ---- 3. the documented accumulation pattern ----------------------------------------------------------------

def test_accumulation_pattern_equals_sam_on_the_accumulated_batch():
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = mlp()
    sam = _sam(model)
    model, optimizer, loader = accelerator.prepare(model, sam, _loader(4))  # 2 micro-batches of 4 per update
    assert not hasattr(optimizer, 'first_step') and optimizer.optimizer is sam  # use the SAM given to prepare
    _accelerate_window_loop(accelerator, model, sam, optimizer, loader)
    assert sam.state_dict()['sam']['step'] == len(DATA)  # one SAM update per window
    assert _max_diff(_weights(model), _reference()) <= 1e-6


# ---- 4. two processes (gloo, CPU) against one on the global batch ------------------------------------------

def _two_process_worker(rank, world_size, port, out_dir):
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS='1')
    torch.set_num_threads(1)
    AcceleratorState._reset_state(True)  # the fork inherits the parent's singletons
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(split_batches=True))
    assert accelerator.num_processes == world_size
    results = {}
    model = mlp()
    model, optimizer, loader = accelerator.prepare(model, _sam(model), _loader(8))  # 4 images per process
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel) and next(iter(loader))[0].shape[0] == 4
    _accelerate_closure_loop(accelerator, model, optimizer, loader)
    results['closure'] = _weights(accelerator.unwrap_model(model))
    accelerator.gradient_accumulation_steps = 2
    model = mlp()
    sam = _sam(model)
    model, optimizer, loader = accelerator.prepare(model, sam, _loader(4))  # 2 micro-batches of 2 per process
    _accelerate_window_loop(accelerator, model, sam, optimizer, loader)
    results['window'] = _weights(accelerator.unwrap_model(model))
    torch.save(results, os.path.join(out_dir, f'rank{rank}.pt'))
    accelerator.end_training()


def test_two_processes_equal_one_on_the_global_batch(tmp_path):
    spawn_gloo(_two_process_worker, 2, str(tmp_path))
    ref, one_process = _reference(), _plain_closure_loop()  # 1 process, batches of 8
    for rank in range(2):
        results = torch.load(tmp_path / f'rank{rank}.pt')
        for route in ('closure', 'window'):
            assert _max_diff(results[route], one_process) <= 1e-5  # measured: 3e-8
            assert _max_diff(results[route], ref) <= 1e-5


# ---- 5. mixed precision ------------------------------------------------------------------------------------

def test_bf16_equals_closure_loop_under_autocast():
    accelerator = Accelerator(cpu=True, mixed_precision='bf16')
    model = mlp()
    model, optimizer, loader = accelerator.prepare(model, _sam(model), _loader(8))
    _accelerate_closure_loop(accelerator, model, optimizer, loader)
    got = _weights(accelerator.unwrap_model(model))
    assert _max_diff(got, _plain_closure_loop(bf16=True)) == 0.0
    assert _max_diff(got, _reference(bf16=True)) <= 1e-6
    assert _max_diff(got, _reference()) > 1e-4  # bf16 did run


def test_fp16_on_cpu_is_fp32():
    """Accelerate accepts mixed_precision='fp16' on a CPU but gives it no GradScaler and no autocast."""
    accelerator = Accelerator(cpu=True, mixed_precision='fp16')
    assert accelerator.scaler is None
    model = mlp()
    model, optimizer, loader = accelerator.prepare(model, _sam(model), _loader(8))
    _accelerate_closure_loop(accelerator, model, optimizer, loader)
    assert _max_diff(_weights(accelerator.unwrap_model(model)), _reference()) <= 1e-6


def _fp16_prepared():
    """What Accelerator(mixed_precision='fp16') builds on a GPU, on the CPU: its GradScaler, given to the
    AcceleratedOptimizer by prepare and used by accelerator.backward."""
    accelerator = Accelerator(cpu=True)
    accelerator.scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
    model = mlp()
    model, optimizer, loader = accelerator.prepare(model, _sam(model), _loader(8))
    assert optimizer.scaler is accelerator.scaler
    return accelerator, model, optimizer, loader


@pytest.mark.filterwarnings('ignore::FutureWarning')
def test_fp16_scaler_closure_is_refused():
    accelerator, model, optimizer, loader = _fp16_prepared()
    before = _weights(model)
    # the first step: torch's GradScaler.step asserts before SAM runs (no loss was scaled yet)
    with pytest.raises(AssertionError, match='_scale is None'):
        _accelerate_closure_loop(accelerator, model, optimizer, loader)
    assert torch.equal(_weights(model), before)
    # a scaler that already has a scale reaches SAM, which refuses in one line
    accelerator.scaler.scale(torch.ones(()))
    with pytest.raises(ValueError) as e:
        _accelerate_closure_loop(accelerator, model, optimizer, loader)
    assert str(e.value) == ACCELERATE_FP16
    assert "mixed_precision='bf16'" in str(e.value) and '\n' not in str(e.value)
    assert torch.equal(_weights(model), before)


@pytest.mark.filterwarnings('ignore::FutureWarning')
def test_fp16_message_unit():
    accelerator = Accelerator(cpu=True)
    accelerator.scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 10)
    probe = _Probe()
    optimizer = accelerator.prepare(probe)
    accelerator.scaler.scale(torch.ones(()))
    optimizer.step(lambda: None)  # through GradScaler.step(optimizer, closure)
    assert probe.seen == [ACCELERATE_FP16]
    assert '\n' not in ACCELERATE_FP16


# ---- 6. resume: save_state after 2 updates, load_state into a SAM built with other settings -------------------

def _accelerated(route, **settings):
    """A fresh Accelerator, model and SAM, prepared: the closure loop on batches of 8, or the accumulation
    pattern on 2 micro-batches of 4 per update."""
    AcceleratorState._reset_state(True)  # a resumed run is a new process
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=1 if route == 'closure' else 2)
    model = mlp()
    sam = _sam(model, **settings)
    model, optimizer, loader = accelerator.prepare(model, sam, _loader(8 if route == 'closure' else 4))
    return accelerator, model, sam, optimizer, loader


def _train(route, accelerator, model, sam, optimizer, batches_):
    if route == 'closure':
        _accelerate_closure_loop(accelerator, model, optimizer, batches_)
    else:
        _accelerate_window_loop(accelerator, model, sam, optimizer, batches_)


# the checkpointed run's settings, and the other ones the resumed run's SAM is built with (the checkpoint wins);
# interval=3 makes the update count matter: updates 0 and 3 are SAM steps, 1 and 2 plain ones (a count reset
# to 0 on resume: 6.4e-3 off)
RESUME = {'closure': (dict(interval=3), dict(rho=0.2, interval=1, clip_grad=0.5)),
          'window': (dict(), dict(rho=0.2, interval=3, clip_grad=0.5))}


@pytest.mark.parametrize('route', ['closure', 'window'])
def test_save_state_load_state_resumes_exactly(route, tmp_path, caplog):
    saved_settings, other_settings = RESUME[route]
    per_update = 1 if route == 'closure' else 2  # loader batches per update
    accelerator, model, sam, optimizer, loader = _accelerated(route, **saved_settings)
    _train(route, accelerator, model, sam, optimizer, itertools.islice(loader, 2 * per_update))  # 2 updates
    saved_entry = sam.state_dict()['sam']
    assert saved_entry['step'] == 2 and saved_entry['interval'] == saved_settings.get('interval', 1)
    accelerator.save_state(str(tmp_path))
    on_disk = torch.load(tmp_path / 'optimizer.bin', weights_only=True)  # how Accelerate loads it
    assert on_disk['sam'] == saved_entry and on_disk['param_groups'][0]['rho'] == RHO

    accelerator, model, sam, optimizer, loader = _accelerated(route, **other_settings)
    assert sam.state_dict()['sam']['step'] == 0 and sam.param_groups[0]['rho'] == 0.2
    with caplog.at_level(logging.WARNING, logger='timm_ext.optim.sam'):
        accelerator.load_state(str(tmp_path))
    assert sam.state_dict()['sam'] == saved_entry  # update count, interval, clip_grad (None): the checkpoint's
    assert sam.param_groups[0]['rho'] == RHO
    assert 'rho: 0.2 -> 0.05' in caplog.text and 'clip_grad: 0.5 -> None' in caplog.text
    _train(route, accelerator, model, sam, optimizer, accelerator.skip_first_batches(loader, 2 * per_update))
    assert sam.state_dict()['sam']['step'] == len(DATA)
    resumed = _weights(model)

    accelerator, model, sam, optimizer, loader = _accelerated(route, **saved_settings)
    _train(route, accelerator, model, sam, optimizer, loader)  # 4 updates, uninterrupted
    assert _max_diff(resumed, _weights(model)) == 0.0  # bit for bit
    assert _max_diff(resumed, _reference(interval=saved_settings.get('interval', 1))) <= 1e-6  # measured: 0.0 / 1.5e-8


# ---- 7. clipping inside the closure ----------------------------------------------------------------------------

MAX_NORM, CLIP_VALUE = 0.25, 0.05  # below every pass's gradient norm (0.37 .. 0.71) and max |g| (0.18 .. 0.32)


def _clip_norm(v):
    return v * min(1.0, MAX_NORM / (v.norm().item() + 1e-6))  # torch's clip_grad_norm_ coefficient


def _clip_value(v):
    return v.clamp(-CLIP_VALUE, CLIP_VALUE)


def _accelerate_clipped(clip):
    """The closure loop with accelerator.clip_grad_norm_ / clip_grad_value_ after accelerator.backward: it runs
    in both of SAM's passes. Returns the weights and the norms clip_grad_norm_ saw."""
    accelerator = Accelerator(cpu=True)
    model = mlp()
    model, optimizer, loader = accelerator.prepare(model, _sam(model), _loader(8))
    norms = []
    if clip == 'norm':
        def clip_fn():
            norms.append(accelerator.clip_grad_norm_(model.parameters(), MAX_NORM).item())
    else:
        def clip_fn():
            accelerator.clip_grad_value_(model.parameters(), CLIP_VALUE)
    _accelerate_closure_loop(accelerator, model, optimizer, loader, clip=clip_fn)
    return _weights(model), norms


def _sam_clipped(clip_mode, clip_grad):
    """SAM's own clipping (of the gradient it applies, h), closure loop without Accelerate."""
    model = mlp()
    opt = _sam(model, clip_grad=clip_grad, clip_mode=clip_mode)
    for x, y in _loader(8):
        opt.step(closure_of(model, opt, x, y))
    return _weights(model)


def test_clip_grad_norm_in_the_closure_equals_sam_clip_grad():
    """clip_grad_norm_ in the closure scales g too, which the perturbation normalizes away: SAM's clip_grad."""
    got, norms = _accelerate_clipped('norm')
    assert len(norms) == 2 * len(DATA) and min(norms) > MAX_NORM  # both passes of each update, clipping active
    ref = _reference(clip=_clip_norm)
    assert _max_diff(got, _sam_clipped('norm', MAX_NORM)) <= 1e-6  # measured: 3.0e-8
    assert _max_diff(got, ref) <= 1e-6  # measured: 3.0e-8
    assert _max_diff(got, _reference()) > 1e-3  # clipping changed the run (measured: 6.9e-3)


def test_clip_grad_value_in_the_closure_is_not_sam_clip_mode_value():
    """clip_grad_value_ in the closure clips g elementwise too, which turns the perturbation: not SAM's
    clip_mode='value' (which clips h alone), but SAM perturbing with the clipped g."""
    got, _ = _accelerate_clipped('value')
    sam_value = _sam_clipped('value', CLIP_VALUE)
    assert _max_diff(sam_value, _reference(clip=_clip_value)) <= 1e-6
    assert _max_diff(got, _reference(clip=_clip_value, clip_first=True)) <= 1e-6
    assert _max_diff(got, sam_value) > 1e-4  # measured: 8.6e-4
