"""SAM in PyTorch Lightning's automatic optimization, with the real Lightning.

``configure_optimizers`` returns SAM from timm's factory; Lightning hands ``SAM.step`` its wrapped closure
(training_step, zero_grad, backward, then its gradient clipping). Each supported setting is checked against an
independent reference, a hand-written closure loop on the same batches (or, for the plain case, SAM written
out in torch on flat vectors), with the max |diff| asserted; each setting SAM cannot make exact is refused in
one line before any weight moves (``timm_ext/integrations/lightning.py``, imported by ``timm_ext``'s autoload when
Lightning is), accumulation with the manual-optimization pattern that replaces it. Tiny MLP, CPU, a few steps each.
"""
import copy
import functools
import logging
import os
import subprocess
import sys
import warnings

import pytest

pytest.importorskip('lightning', reason='PyTorch Lightning is not installed (pip install lightning)')

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _sam_reference import at, batch, flat, grad, mlp, sgd_reference  # noqa: E402
from _threads import same_threads  # noqa: E402
from lightning.pytorch.plugins.precision import DeepSpeedPrecision, MixedPrecision  # noqa: E402
from timm.optim import create_optimizer_v2  # noqa: E402
from timm.scheduler import StepLRScheduler  # noqa: E402

import timm_ext  # noqa: E402, F401  (registers samadamw, ...)
from timm_ext.integrations.lightning import (  # noqa: E402
    ACCUMULATE,
    CLIP_VALUE,
    CLIP_VARIANT,
    DEEPSPEED,
    FP16,
    M_SHARPNESS,
    MANUAL_NO_CLOSURE,
    UNCOUNTED,
    lightning_problem,
)

pytestmark = [
    pytest.mark.filterwarnings('ignore::UserWarning'),  # Lightning's advice (num_workers, logging, ...)
    pytest.mark.filterwarnings('ignore::FutureWarning'),  # torch's GradScaler `grad_scaler` argument notice
]
logging.getLogger('lightning.pytorch').setLevel(logging.ERROR)

LR, RHO, WD = 0.05, 0.1, 0.05
OPT = dict(lr=LR, rho=RHO, weight_decay=WD)
DATA = [batch(8, seed=s) for s in range(8)]  # 64 samples: 8 batches of 8, or 4 global batches of 16 (DDP)
X, Y = torch.cat([x for x, _ in DATA]), torch.cat([y for _, y in DATA])


class Classifier(pl.LightningModule):
    """The test's LightningModule: the seeded MLP, SAM from timm's factory, an optional scheduler."""

    def __init__(self, opt: str = 'samadamw', scheduler=None, **opt_kwargs):
        super().__init__()
        self.net = mlp()
        self.opt, self.opt_kwargs, self.scheduler = opt, dict(OPT, **opt_kwargs), scheduler
        if opt.startswith('gsam'):
            del self.opt_kwargs['rho']  # GSAM's radius is rho_max / rho_min
        self.lrs = []  # the base optimizer's lr at each step

    def on_train_batch_start(self, xy, batch_idx):  # once per step (training_step runs twice: both passes)
        self.lrs.append(self.trainer.optimizers[0].base_optimizer.param_groups[0]['lr'])

    def training_step(self, xy, batch_idx):
        x, y = xy
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):  # as docs/integrations.md: timm's groups from the network, SAM knows the module
        sam = create_optimizer_v2(self.net, self.opt, model=self, **self.opt_kwargs)
        if self.scheduler is None:
            return sam
        return {'optimizer': sam, 'lr_scheduler': {'scheduler': self.scheduler(sam), 'interval': 'step'}}

    def lr_scheduler_step(self, scheduler, metric):
        if isinstance(scheduler, StepLRScheduler):  # timm's schedulers step by update count
            scheduler.step_update(num_updates=self.trainer.global_step)
        else:
            scheduler.step()


def loader(batch_size: int = 8, n: int = 64):
    dataset = torch.utils.data.TensorDataset(X[:n], Y[:n])
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)


def trainer(**kwargs) -> pl.Trainer:
    kwargs = dict(dict(max_steps=4, accelerator='cpu', devices=1, enable_progress_bar=False, logger=False,
                       enable_checkpointing=False, enable_model_summary=False), **kwargs)
    return pl.Trainer(**kwargs)


def fit(module: Classifier, data=None, ckpt_path=None, **kwargs) -> torch.Tensor:
    """Train ``module`` with Lightning; its final flat weights."""
    trainer(**kwargs).fit(module, data or loader(), ckpt_path=ckpt_path)
    return flat(module.parameters()).detach()


def closure_loop(opt: str = 'samadamw', steps: int = 4, batch_size: int = 8, autocast=None, clip=None,
                 scheduler=None, **opt_kwargs):
    """The reference: the same SAM driven by a hand-written closure (``clip``: clip inside it, as Lightning does);
    the final flat weights and the lr of each step."""
    holder = nn.Module()
    holder.net = net = mlp()
    sam = create_optimizer_v2(holder, opt, **dict(OPT, **opt_kwargs))
    sched = scheduler(sam) if scheduler else None
    lrs = []
    for t in range(steps):
        x, y = X[t * batch_size:(t + 1) * batch_size], Y[t * batch_size:(t + 1) * batch_size]

        def closure(x=x, y=y):
            sam.zero_grad()
            with torch.autocast('cpu', dtype=autocast, enabled=autocast is not None):
                loss = F.cross_entropy(net(x), y)
            loss.backward()
            params = [p for group in sam.param_groups for p in group['params']]  # in the optimizer's order
            if clip == 'norm':
                torch.nn.utils.clip_grad_norm_(params, 0.05)
            elif clip == 'value':
                torch.nn.utils.clip_grad_value_(params, 0.05)
            return loss

        lrs.append(sam.base_optimizer.param_groups[0]['lr'])
        sam.step(closure)
        if isinstance(sched, StepLRScheduler):
            sched.step_update(num_updates=t + 1)
        elif sched is not None:
            sched.step()
    return flat(net.parameters()).detach(), lrs


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def untouched_after_refusal(module: Classifier, match: str, **kwargs) -> str:
    """Fit, expecting a one-line ValueError equal to ``match``; the weights must still be the initial ones."""
    w0 = flat(module.parameters()).detach().clone()
    with pytest.raises(ValueError) as info:
        fit(module, **kwargs)
    message = str(info.value)
    assert message == match and '\n' not in message
    assert torch.equal(flat(module.parameters()).detach(), w0)
    return message


# ---- 1. plain -------------------------------------------------------------------------------------------------

def test_plain_equals_closure_loop_bit_for_bit():
    w = fit(Classifier())
    ref, _ = closure_loop()
    assert max_diff(w, ref) == 0.0  # measured 0.0: Lightning's closure is a plain closure, called twice by SAM


def _docs_lit_vit() -> type:
    """The LitViT class of docs/integrations.md's Lightning snippet, as written (the lines before its data)."""
    from test_docs_integrations import runnable_snippets
    code = next(c for section, c in runnable_snippets() if section == 'PyTorch Lightning' and 'class LitViT(' in c)
    names: dict = {}
    exec(code.split('\ndata = ')[0], names)  # noqa: S102 - the documentation's own text
    return names['LitViT']


def test_docs_snippet_decays_what_timm_decays_and_equals_the_closure_loop_over_the_vit():
    """The snippet's SAM over a ViT with tokens: timm's weight-decay groups for the ViT (cls_token, pos_embed,
    norms and biases undecayed), the LightningModule as SAM's model, and 3 steps equal to a closure loop built by
    timm's factory over the bare ViT, bit for bit."""
    lit = _docs_lit_vit()()
    vit = copy.deepcopy(lit.model)
    sam = lit.configure_optimizers()['optimizer']
    ref = create_optimizer_v2(vit, 'samadamw', lr=1e-3, weight_decay=0.05, rho=0.05, clip_grad=1.0)
    decayed = [sum(p.numel() > 0 for p in g['params']) for g in sam.param_groups if g['weight_decay'] > 0]
    assert decayed == [sum(p.numel() > 0 for p in g['params']) for g in ref.param_groups if g['weight_decay'] > 0]
    assert decayed == [50] and sam.model is lit
    x, y = torch.randn(48, 3, 32, 32), torch.randint(0, 10, (48,))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    trainer(max_steps=3).fit(lit, data)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(ref, T_max=100)
    for xb, yb in data:
        def closure(xb=xb, yb=yb):
            ref.zero_grad()
            loss = F.cross_entropy(vit(xb), yb)
            loss.backward()
            return loss
        ref.step(closure)
        sched.step()
    assert torch.equal(flat(lit.model.parameters()), flat(vit.parameters()))


def test_plain_equals_sam_written_in_torch():
    """sammomentum against SAM written out on flat vectors with torch's SGD (no timm_ext in the reference)."""
    w = fit(Classifier('sammomentum', momentum=0.9, weight_decay=0.0))

    def sam_direction(model, t, xy):
        g = grad(model, *xy)
        return grad(at(model, flat(model.parameters()) + RHO * g / g.norm()), *xy)

    ref = sgd_reference(mlp(), DATA[:4], sam_direction, lr=LR, momentum=0.9)
    # measured 3.0e-08: the flat norm sums in another order than SAM's per-tensor one (a few float32 ulps of e)
    assert max_diff(w, ref) <= 1e-6


class LossSeen(Classifier):
    """What Lightning reports as the step's loss, and what SAM.step returns (through optimizer_step)."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def on_train_batch_end(self, outputs, xy, batch_idx):
        self.seen['outputs'] = outputs['loss']

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        self.seen['returned'] = optimizer.step(closure=optimizer_closure)


def test_reported_loss_is_the_second_pass_and_step_returns_the_loss_at_w():
    """training_step runs at w and at w + e; Lightning keeps the last result, so `outputs` (and self.log) carry
    L(w + e), while SAM.step returns L(w): log that one from optimizer_step."""
    module = LossSeen()
    fit(module, max_steps=1)
    x, y = DATA[0]
    model = mlp()
    at_w = F.cross_entropy(model(x), y)
    g = grad(model, x, y)
    at_w_e = F.cross_entropy(at(model, flat(model.parameters()) + RHO * g / g.norm())(x), y)
    assert module.seen['returned'].item() == at_w.item()  # measured 0.0
    assert abs(module.seen['outputs'].item() - at_w_e.item()) <= 1e-6  # measured 0.0 (flat norm: 1 ulp allowed)
    assert module.seen['outputs'].item() > at_w.item()  # the ascent step raised the loss


# ---- 2. gradient accumulation: refused, and the manual-optimization window instead ------------------------------

def test_accumulate_grad_batches_refused_before_any_update():
    message = untouched_after_refusal(Classifier(), ACCUMULATE.format(n=2), accumulate_grad_batches=2)
    assert 'manual optimization' in message and 'docs/integrations.md' in message


class WindowedSAM(Classifier):
    """docs/integrations.md's Lightning accumulation pattern: manual optimization keeps the window's micro-batches
    and steps SAM once per window with a closure over all of them (mean loss), so SAM sees the accumulated batch."""

    def __init__(self, accumulate: int = 2):
        super().__init__()
        self.automatic_optimization = False
        self.accumulate, self.window, self.returned = accumulate, [], []

    def training_step(self, xy, batch_idx):
        self.window.append(xy)
        if len(self.window) < self.accumulate:
            return None
        opt = self.optimizers()

        def closure():
            opt.zero_grad()
            total = 0.0
            for x, y in self.window:
                loss = F.cross_entropy(self.net(x), y) / len(self.window)
                self.manual_backward(loss)
                total += loss.detach()
            return total

        self.returned.append(opt.step(closure=closure))
        self.window = []
        return None


def test_manual_window_equals_sam_on_the_accumulated_batch():
    """Micro-batches of 4 in windows of 2 against the closure loop on batches of 8: one SAM step per window, e and
    the update from the window's mean loss; Lightning counts one optimizer step per window."""
    module = WindowedSAM(accumulate=2)
    w = fit(module, loader(4, n=32), max_steps=-1, max_epochs=1)
    ref, _ = closure_loop(steps=4, batch_size=8)
    assert module.trainer.global_step == 4 and len(module.returned) == 4
    # measured 3.0e-08 on this machine: two means of 4, halved, against one mean of 8 (float32 summation order)
    assert max_diff(w, ref) <= 1e-6


# ---- 3. bf16-mixed -------------------------------------------------------------------------------------------------

def test_bf16_mixed_equals_closure_loop_under_autocast():
    w = fit(Classifier(), precision='bf16-mixed')
    ref, _ = closure_loop(autocast=torch.bfloat16)
    assert max_diff(w, ref) == 0.0  # measured 0.0: both passes run under Lightning's autocast


# ---- 4. 16-mixed -----------------------------------------------------------------------------------------------------

def test_16_mixed_on_cpu_becomes_bf16_mixed():
    """Lightning itself replaces precision='16-mixed' by 'bf16-mixed' on the CPU (with a warning)."""
    assert trainer(precision='16-mixed').precision == 'bf16-mixed'


def test_16_mixed_plugin_is_refused_in_one_line_before_any_update():
    """An explicit fp16 MixedPrecision plugin (GradScaler on the CPU) runs the closure itself, then steps SAM
    without it: SAM.step() asks the framework checks, which name the setting; no weight moves."""
    untouched_after_refusal(Classifier(), FP16, plugins=[MixedPrecision('16-mixed', 'cpu')])


class _Trainer:
    """Stands for a Trainer whose strategy holds ``precision_plugin`` (a DeepSpeed strategy needs deepspeed)."""

    def __init__(self, precision_plugin):
        self.precision_plugin = precision_plugin


def _attached(precision_plugin) -> Classifier:
    module = Classifier()
    module.trainer = _Trainer(precision_plugin)
    return module


def test_no_closure_outside_lightning_plugins_is_not_refused():
    """Asked only where SAM has nothing to replay, the check names a Lightning setting from the trainer of SAM's
    model: none for a model that is no LightningModule (timm's train.py replays), for one not attached to a
    Trainer, or for a plugin that passes SAM the closure (bf16: no GradScaler)."""
    assert lightning_problem(None, create_optimizer_v2(mlp(), 'samadamw', lr=LR)) is None
    assert lightning_problem(None, create_optimizer_v2(Classifier(), 'samadamw', lr=LR)) is None
    bf16 = create_optimizer_v2(_attached(MixedPrecision('bf16-mixed', 'cpu')), 'samadamw', lr=LR)
    assert lightning_problem(None, bf16) is None
    fp16 = create_optimizer_v2(_attached(MixedPrecision('16-mixed', 'cpu')), 'samadamw', lr=LR)
    assert lightning_problem(None, fp16) == FP16


def test_deepspeed_refused_from_its_plugin():
    """DeepSpeed runs the closure inside DeepSpeedPrecision.optimizer_step and steps its engine without it: SAM's
    step() finds nothing to replay and names the setting from its model's trainer, before any weight moves."""
    module = _attached(DeepSpeedPrecision('32-true'))
    sam = create_optimizer_v2(module, 'samadamw', lr=LR)
    assert lightning_problem(None, sam) == DEEPSPEED and '\n' not in DEEPSPEED
    w0 = flat(module.parameters()).detach().clone()
    x, y = batch(4)
    F.cross_entropy(module.net(x), y).backward()
    with pytest.raises(ValueError) as info:
        sam.step()  # what the engine calls
    assert str(info.value) == DEEPSPEED
    assert torch.equal(flat(module.parameters()).detach(), w0)


# ---- 5. gradient clipping ------------------------------------------------------------------------------------------

def test_gradient_clip_norm_equals_sam_clip_grad():
    """Lightning clips inside its closure, so both passes; by norm that keeps e's direction, and the second pass's
    clip is SAM's own clip_grad: equal to clip_grad=0.05 (clip_mode='norm')."""
    w = fit(Classifier(), gradient_clip_val=0.05, gradient_clip_algorithm='norm')
    both_clipped, _ = closure_loop(clip='norm')
    sam_clip, _ = closure_loop(clip_grad=0.05, clip_mode='norm')
    unclipped, _ = closure_loop()
    assert max_diff(w, both_clipped) == 0.0  # measured 0.0: Lightning's clip is a clip inside the closure
    # measured 6.0e-08: e from c*g instead of g (the clip factor's rounding, 1 ulp of e); the clip itself bites
    assert max_diff(w, sam_clip) <= 1e-6 < max_diff(w, unclipped)


def test_gradient_clip_value_refused():
    """By value, clipping the first-pass gradient turns e: measured against SAM's clip_mode='value' (which clips
    only the gradient it applies) the results differ by 0.105, so Lightning's value clipping is refused."""
    both_clipped, _ = closure_loop(clip='value')
    sam_clip, _ = closure_loop(clip_grad=0.05, clip_mode='value')
    assert max_diff(both_clipped, sam_clip) > 1e-2  # measured 0.105
    message = untouched_after_refusal(Classifier(), CLIP_VALUE.format(val=0.05), gradient_clip_val=0.05,
                                      gradient_clip_algorithm='value')
    assert 'gradient_clip_val' in message and "clip_mode='value'" in message


@pytest.mark.parametrize('opt', ['gsamadamw', 'looksamadamw'])
def test_gradient_clip_norm_refused_for_variants_reading_g(opt):
    """GSAM's decomposition and LookSAM's kept direction read the first-pass gradient Lightning clipped: measured
    1.0e-05 (GSAM) and 0.010 (LookSAM, interval 2) from their own clip_grad, so refused."""
    kwargs = dict(interval=2) if opt.startswith('look') else {}
    message = CLIP_VARIANT.format(val=0.05, name='GSAM' if opt.startswith('g') else 'LookSAM', mode='norm')
    untouched_after_refusal(Classifier(opt, **kwargs), message, gradient_clip_val=0.05)


def test_m_sharpness_refused():
    untouched_after_refusal(Classifier(m_sharpness=4), M_SHARPNESS.format(m=4))


def test_manual_optimization_step_without_closure_refused():
    class Manual(Classifier):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, xy, batch_idx):
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(F.cross_entropy(self.net(xy[0]), xy[1]))
            opt.step()

    untouched_after_refusal(Manual(), MANUAL_NO_CLOSURE)


class ManualSAM(Classifier):
    """Manual optimization as docs/integrations.md writes it: SAM's first_step(), the second backward, then
    ``opt.step()``, which finishes the update and which Lightning counts (or, ``finish='second_step'``, davda54's
    Lightning tip: ``opt.second_step()``, which trains the same and which Lightning does not count)."""

    def __init__(self, finish: str = 'step'):
        super().__init__()
        self.automatic_optimization = False
        self.finish = finish

    def training_step(self, xy, batch_idx):
        opt = self.optimizers()
        x, y = xy
        self.manual_backward(F.cross_entropy(self.net(x), y))
        opt.optimizer.first_step()
        self.manual_backward(F.cross_entropy(self.net(x), y))
        opt.step() if self.finish == 'step' else opt.second_step()
        opt.zero_grad()


def test_manual_first_step_then_opt_step_is_counted_and_exact():
    module = ManualSAM()
    with warnings.catch_warnings():
        warnings.simplefilter('error', UserWarning)
        warnings.filterwarnings('ignore', message='.*(num_workers|does not have many workers|log_every_n_steps).*')
        w = fit(module, max_steps=4)
    ref, _ = closure_loop(steps=4)
    assert module.trainer.global_step == 4
    assert torch.equal(w, ref)


def test_manual_second_step_warns_once_that_lightning_does_not_count_it():
    module = ManualSAM(finish='second_step')
    with pytest.warns(UserWarning) as record:
        w = fit(module, loader(n=24), max_steps=-1, max_epochs=1)
    lines = [str(r.message) for r in record if str(r.message) == UNCOUNTED]
    assert len(lines) == 1 and module.trainer.global_step == 0  # 3 updates taken, none counted
    assert torch.equal(w, closure_loop(steps=3)[0])


def test_other_closures_are_not_lightnings():
    sam = create_optimizer_v2(mlp(), 'samadamw', lr=LR)
    assert lightning_problem(lambda: None, sam) is None
    assert lightning_problem(functools.partial(print, 1), sam) is None
    assert lightning_problem(functools.partial(print, Classifier()), sam) is None  # not attached to a Trainer


# ---- 6. DDP ------------------------------------------------------------------------------------------------------

class SaveWeights(pl.Callback):
    def __init__(self, path):
        self.path = path

    def on_train_end(self, trainer, module):
        torch.save(flat(module.parameters()).detach(), self.path / f'rank{trainer.global_rank}.pt')


class Sharded(Classifier):
    """Each rank takes 8 of every global batch of 16, in order (Lightning's own DistributedSampler shuffles)."""

    def train_dataloader(self):
        sampler = torch.utils.data.DistributedSampler(torch.utils.data.TensorDataset(X, Y), shuffle=False,
                                                      num_replicas=self.trainer.world_size,
                                                      rank=self.trainer.global_rank)
        return torch.utils.data.DataLoader(sampler.dataset, batch_size=8, sampler=sampler)


@pytest.mark.slow
def test_ddp_two_processes_equal_one_on_the_global_batch(tmp_path):
    """strategy='ddp_fork' (gloo, 2 CPU processes; 'ddp' would re-launch pytest itself): rank r gets rows
    r, r + 2, ... of each global batch of 16, both of SAM's passes are all-reduced, so e is the global batch's.
    The fork is made from a fresh interpreter: PyTorch refuses a backward in a child forked from a process whose
    autograd engine has started its threads (a torch.compile backward does), and this test's pytest worker may have
    run such a test before it."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f'import sys; sys.path.insert(0, {here!r}); from pathlib import Path; import test_integrations_lightning '
            f'as t; t.trainer(devices=2, strategy="ddp_fork", use_distributed_sampler=False, '
            f'callbacks=[t.SaveWeights(Path({str(tmp_path)!r}))]).fit(t.Sharded())')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS=same_threads()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref, _ = closure_loop(batch_size=16)
    ranks = [torch.load(tmp_path / f'rank{r}.pt') for r in range(2)]
    assert torch.equal(ranks[0], ranks[1])
    # measured 1.2e-07: the mean of two means of 8 against one mean of 16 (float32 summation order)
    assert max_diff(ranks[0], ref) <= 1e-5


# ---- 7. checkpoint and resume --------------------------------------------------------------------------------------

def test_checkpoint_resume_equals_uninterrupted(tmp_path):
    """Two epochs of 2 batches: uninterrupted, and one epoch, a Lightning checkpoint, a fresh module resumed
    from it. The checkpoint holds SAM's "sam" entry and the base optimizer's AdamW moments."""
    data = lambda: loader(8, n=16)  # noqa: E731
    whole = Classifier()
    w_whole = fit(whole, data(), max_steps=-1, max_epochs=2)
    first = Classifier()
    t = trainer(max_steps=-1, max_epochs=1)
    t.fit(first, data())
    t.save_checkpoint(tmp_path / 'epoch1.ckpt')
    ckpt = torch.load(tmp_path / 'epoch1.ckpt', weights_only=False)
    state = ckpt['optimizer_states'][0]
    assert state['sam']['step'] == 2 and state['sam']['clip_mode'] == 'norm'
    assert {'exp_avg', 'exp_avg_sq'} <= set(state['state'][0])
    resumed = Classifier()
    w_resumed = fit(resumed, data(), ckpt_path=tmp_path / 'epoch1.ckpt', max_steps=-1, max_epochs=2)
    assert max_diff(w_resumed, w_whole) == 0.0  # measured 0.0
    a, b = whole.trainer.optimizers[0].state_dict(), resumed.trainer.optimizers[0].state_dict()
    assert a['sam'] == b['sam'] and a['sam']['step'] == 4
    assert all(torch.equal(a['state'][i][k], b['state'][i][k]) for i in a['state'] for k in a['state'][i])


# ---- 8. LR schedulers ---------------------------------------------------------------------------------------------

SCHEDULERS = {
    'torch StepLR': lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
    'timm StepLRScheduler': lambda opt: StepLRScheduler(opt, decay_t=1, decay_rate=0.5, t_in_epochs=False),
}


@pytest.mark.parametrize('name', list(SCHEDULERS))
def test_lr_scheduler_drives_the_base_optimizer(name):
    module = Classifier(scheduler=SCHEDULERS[name])
    w = fit(module)
    ref, ref_lrs = closure_loop(scheduler=SCHEDULERS[name])
    assert module.lrs == ref_lrs == [LR * 0.5 ** k for k in range(4)]
    assert max_diff(w, ref) == 0.0  # measured 0.0
