""" bSAM: Bayesian SAM, SAM as an optimal relaxation of Bayes

Paper: Möllenhoff & Khan, *SAM as an Optimal Relaxation of Bayes*, ICLR 2023, https://arxiv.org/abs/2210.01620
(official JAX code: team-approx-bayes/bayesian-sam, ``build_bsam_optimizer``). Written from the paper and that code.

bSAM keeps a Gaussian over the weights, mean w and per-weight precision s (started at ``s_init``), learnt by an
Adam-like update; with N the data size (``num_data``), one update is

    eps ~ N(0, 1 / (N s))              # elementwise variance
    g = grad L(w + eps)                # first pass, at a sample of the weights
    h = grad L(w + rho * g / s)        # second pass, the ascent taken from the mean, elementwise over s
    m = beta1 m + (1 - beta1) (h + d w)
    w = w - lr * m / s                 # with s before its update
    s = beta2 s + (1 - beta2) (sqrt(s) |g| + damping + d)

Two forward-backward passes per step, as SAM. Here it is a :class:`SAM` whose base optimizer is the descent above
(``bsam_update.BSAMUpdate``), so it has SAM's routes: ``step(closure)``, ``first_step()``/``second_step()``, timm's
train.py (its task replayed for the second pass), fp16 GradScaler, ``clip_grad`` (of h), resume, DDP.

What is ours. The noise: given the model (timm's factory passes it; train.py's task gives it too), a forward pre-hook
moves the weights to w + eps at the first training forward after a step, and ``perturb()`` puts them back to w
bit-exactly before the ascent, so evaluation, checkpoints and timm's model EMA see w. Without a model only
``step(closure)`` can run bSAM (it draws the noise itself before its first pass); a first pass run elsewhere was at w,
and is refused in one line. eps is drawn from a generator of the optimizer's own, seeded by ``seed`` and advanced by
one draw per update on every process alike (DDP ranks stay equal), saved in the state dict. Refused in one line:
SAM's ``adaptive``/``eta``, ``interval``, ``m_sharpness`` (the official code's ``batchsplit``), ``use_gc``, and
sharded (FSDP2) parameters. Under torch.distributed ``sqrt(s) |g|`` is averaged over the workers (one all-reduce),
so s stays the same on every rank even when the first pass ran in ``no_sync``.
"""
import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.nn as nn
from timm.optim import OptimInfo, OptimizerRegistry

from timm_ext._timm_compat import default_optimizer_registry, registry_optimizers
from timm_ext.optim.bsam_update import BSAM_BETAS, BSAM_LR, BSAMUpdate
from timm_ext.optim.ddp import all_reduce_mean, world_size
from timm_ext.optim.sam import SAM
from timm_ext.optim.sam_checkpoint import GROUP_KEY, split_entry
from timm_ext.optim.sam_factory import model_given_to_factory
from timm_ext.optim.sam_functional import keep_, sam_restore_
from timm_ext.optim.sam_settings import BSAM_DAMPING, BSAM_RHO, BSAM_S_INIT, BSAM_WEIGHT_DECAY, BSAMSettings
from timm_ext.optim.training_forward import displace_on_training_forward

__all__ = ['BSAM', 'DISCARDED', 'NOISE_KEY', 'register_bsam_optimizer']

NOISE_KEY = 'noise_generator'  # the noise generator's state in the state dict's "sam" entry


# SAM's settings that bSAM refuses (anything but the value here), and why (one line each)
_REFUSED = {
    'adaptive': (False, 'its ascent rho g / s is already elementwise, scaled by the learnt precision'),
    'eta': (None, 'its ascent rho g / s is already elementwise, scaled by the learnt precision'),
    'interval': (1, 'every update needs its noisy first pass (the precision learns from it)'),
    'm_sharpness': (None, 'per-chunk noise and ascents (the official code\'s batchsplit) are not implemented; the '
                          'whole batch is one chunk'),
    'use_gc': (False, 'the paper has no gradient centralization'),
}


class BSAM(SAM):
    """ bSAM (Bayesian SAM): a Gaussian over the weights, its mean stepped along the gradient at the mean's ascent.

    Args:
        params: parameters or param groups (timm's factory gives its groups).
        lr: step size of the mean (the official code's alpha; its README's bSAM runs: 0.5).
        betas: decays of the momentum and of the precision.
        weight_decay: d (the official code's prior precision over the data size); in the momentum and the precision.
        rho: the ascent ``rho g / s``; per group allowed.
        num_data: N, the training set's size (the official code multiplies it by ``dafactor`` for augmented data).
        s_init: the precision before the first step; per group allowed.
        damping: added to the precision's update; per group allowed.
        seed: the noise generator's seed (the same on every process).
        clip_grad, clip_mode: clip h, the gradient the mean steps with (as :class:`SAM`).
        model: the module whose training forwards see w + eps (timm's factory gives the one it was called with).
        foreach: the update's kernels: multi-tensor (None, True) or tensor by tensor (False).
        adaptive, eta, interval, m_sharpness, use_gc: SAM's, refused in one line unless left at their defaults.
    """
    Settings = BSAMSettings
    needs_clean_gradient = True  # g, for the precision's update

    def __init__(
            self,
            params: Any,
            lr: float = BSAM_LR,
            betas: Sequence[float] = BSAM_BETAS,
            weight_decay: float = BSAM_WEIGHT_DECAY,
            rho: float = BSAM_RHO,
            num_data: Optional[int] = None,
            s_init: float = BSAM_S_INIT,
            damping: float = BSAM_DAMPING,
            seed: int = 0,
            clip_grad: Optional[float] = None,
            clip_mode: str = 'norm',
            model: Optional[nn.Module] = None,
            foreach: Optional[bool] = None,
            adaptive: bool = False,
            eta: Optional[float] = None,
            interval: int = 1,
            m_sharpness: Optional[int] = None,
            use_gc: bool = False,
    ) -> None:
        given = dict(adaptive=adaptive, eta=eta, interval=interval, m_sharpness=m_sharpness, use_gc=use_gc)
        for name, value in given.items():
            if value != _REFUSED[name][0]:
                raise ValueError(f'bSAM does not take {name}={value!r}: {_REFUSED[name][1]}')
        BSAMSettings.checked(num_data=num_data)  # first: the one setting without a default
        base = BSAMUpdate(params, lr=lr, betas=betas, weight_decay=weight_decay, s_init=s_init, damping=damping,
                          foreach=foreach)
        if model is None:
            model = model_given_to_factory(base)  # the module create_optimizer_v2 was called with, if any
        super().__init__(base, rho=rho, clip_grad=clip_grad, clip_mode=clip_mode, model=model, num_data=num_data,
                         s_init=s_init, damping=damping, seed=seed)
        if self._sharded:
            raise ValueError('bSAM does not support sharded (FSDP2) parameters: its noise is drawn per whole tensor')

    def _init_runtime(self) -> None:
        super()._init_runtime()
        self._generator = torch.Generator().manual_seed(self.settings.seed)  # one draw per update: a step's seed
        self._displaced: Optional[List[torch.Tensor]] = None  # the parameters displace() moved to w + eps
        self._due = True  # the next training forward (the first pass) displaces the weights

    def set_model(self, model: Optional[nn.Module]) -> None:
        """The model whose first training forward after a step sees w + eps (a forward pre-hook; train.py's task
        replay and timm's factory give it). Without one, only ``step(closure)`` can run bSAM."""
        super().set_model(model)
        old = getattr(self, '_hook', None)
        if old is not None:
            old.remove()
        self._hook = None if model is None else model.register_forward_pre_hook(displace_on_training_forward(self))

    # ---- the noisy first pass ------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Optional[Callable[..., Any]] = None, grad_scaler: Optional[Any] = None,
             no_sync: Optional[Callable[[], Any]] = None) -> Optional[Any]:
        """As :meth:`SAM.step`; with a closure, the weights go to w + eps before its first pass (a gradient the
        caller took at w, without a model to displace them, is discarded with a warning: the closure runs both)."""
        if closure is None or self._perturbed is not None:
            return super().step(closure, grad_scaler, no_sync)
        if self._displaced is None:
            params = [p for group in self.param_groups for p in group['params']]
            if self.left.first_pass_done(params):  # davda54/sam's convention, or timm's tests: a gradient at w
                if 'discarded' not in self._warned:
                    self._warned.add('discarded')
                    warnings.warn(DISCARDED, stacklevel=2)
                self.base_optimizer.zero_grad()
            self.displace()
        try:
            return super().step(closure, grad_scaler, no_sync)
        except BaseException:
            self.restore()  # w, whatever failed (SAM's own cancel_step ran first where it applies)
            raise

    @torch.no_grad()
    def displace(self) -> None:
        """Back w up and move the weights to w + eps, eps ~ N(0, 1 / (N s)) elementwise: one seed drawn from the
        optimizer's generator, then standard normals (float32) from a generator on each parameter's device seeded
        with it, parameter by parameter in group order. ``perturb()`` (or ``restore()``) puts w back."""
        self._due = False
        if self._displaced is not None:
            return
        params = [p for group in self.param_groups for p in group['params'] if p.requires_grad]
        seed = int(torch.randint(0, 2 ** 62, (), generator=self._generator))
        generators: Dict[torch.device, torch.Generator] = {}
        keep_(self._backup, params, params)
        num_data = self.settings.num_data
        for group in self.param_groups:
            for p in group['params']:
                if not p.requires_grad:
                    continue
                if p.device not in generators:
                    generators[p.device] = torch.Generator(device=p.device).manual_seed(seed)
                noise = torch.randn(p.shape, generator=generators[p.device], device=p.device,
                                    dtype=torch.float32).to(p.dtype)
                s = self.base_optimizer.precision(p)
                if s is None:
                    noise.mul_(1.0 / math.sqrt(num_data * group['s_init']))
                else:
                    noise.mul_(torch.rsqrt(s * num_data))
                p.add_(noise)
        self._displaced = params

    # ---- the ascent from the mean, and back ---------------------------------------------------------------

    @torch.no_grad()
    def perturb(self) -> float:
        """w back bit-exactly from w + eps, then w + rho g / s elementwise (each group's rho; s_init before the first
        step); g kept for the precision. Returns ||g||; a non-finite one (fp16 overflow) leaves w where it is."""
        if self._perturbed is not None:
            raise RuntimeError('bSAM.perturb() was called twice; call restore() (or second_step()) first')
        if self._displaced is None:
            raise RuntimeError(_AT_THE_MEAN.format(call='the ascent'))
        displaced, self._displaced = self._displaced, None
        sam_restore_(displaced, displaced, self._backup)
        groups = [(group, [p for p in group['params'] if p.grad is not None]) for group in self.param_groups]
        params = [p for _, ps in groups for p in ps]
        grads = [p.grad for p in params]
        keep_(self._clean, params, grads)
        norm = float(self._norm(grads)) if grads else 0.0
        keep_(self._backup, params, params)
        if math.isfinite(norm):
            for group, ps in groups:
                for p in ps:
                    s = self.base_optimizer.precision(p)
                    if s is None:
                        p.add_(p.grad, alpha=group['rho'] / group['s_init'])
                    else:
                        p.addcdiv_(p.grad, s, value=group['rho'])
        self._perturbed = params
        return norm

    @torch.no_grad()
    def restore(self) -> None:
        """The weights back to w bit-exactly, from w + rho g / s or from w + eps; the next training forward draws
        the next eps."""
        super().restore()
        displaced, self._displaced = self._displaced or [], None
        sam_restore_(displaced, displaced, self._backup)
        self._due = True

    # ---- the precision's input, sqrt(s) |g| -----------------------------------------------------------------

    @torch.no_grad()
    def observe_sam_gradient(self, params: List[torch.Tensor], clean: Dict[torch.Tensor, torch.Tensor]) -> None:
        """Before the descent: ``sqrt(s) |g|`` (in g's buffer) to the base optimizer."""
        self._hand_curvature([p for p in params if p in clean], clean)

    @torch.no_grad()
    def adjust_plain_gradient(self, params: List[torch.Tensor]) -> None:
        """A one-pass step (SAM takes one on a zero gradient): g is the gradient at hand, and the applied one."""
        self._hand_curvature(params, dict(zip(params, keep_(self._clean, params, [p.grad for p in params]))))

    def plain_step(self, scaling: Optional[Any] = None) -> None:
        self.restore()  # at w, not w + eps
        super().plain_step(scaling)

    def _hand_curvature(self, params: List[torch.Tensor], grads: Dict[torch.Tensor, torch.Tensor]) -> None:
        curvature = [grads[p] for p in params]
        torch._foreach_abs_(curvature)
        wanted = set(params)
        for group in self.param_groups:
            for p in group['params']:
                if p in wanted:
                    s = self.base_optimizer.precision(p)
                    grads[p].mul_(math.sqrt(group['s_init']) if s is None else s.sqrt())
        if world_size() > 1:  # a first pass in no_sync: each rank's g; s must stay equal on every rank
            all_reduce_mean(curvature)
        self.base_optimizer.set_curvature(dict(zip(params, curvature)))

    # ---- checkpoints, copies -------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """SAM's, with the noise generator's state in the ``"sam"`` entry (and its copies in the groups)."""
        state_dict = super().state_dict()
        noise = self._generator.get_state()
        for entry in [state_dict['sam']] + [group.get(GROUP_KEY) for group in state_dict['param_groups']]:
            if isinstance(entry, dict):
                entry[NOISE_KEY] = noise.clone()
        return state_dict

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loaded at w (the weights put back first); the noise continues from the saved generator (a state dict
        without one: this run's generator)."""
        self.restore()
        noise = (split_entry(state_dict)[1] or {}).get(NOISE_KEY)
        if noise is not None and not (isinstance(noise, torch.Tensor) and noise.dtype == torch.uint8):
            raise ValueError(f'bSAM {NOISE_KEY} must be a torch.Generator state (a uint8 tensor), got '
                             f'{type(noise).__name__} in the loaded state dict')
        super().load_state_dict(state_dict)
        if noise is not None:
            self._generator.set_state(noise.cpu())

    def __getstate__(self) -> Dict[str, Any]:
        if self._displaced is not None:
            raise RuntimeError('bSAM cannot be copied or pickled while the weights are at w + eps (between the first '
                               'pass and the step)')
        return dict(super().__getstate__(), _noise_state=self._generator.get_state())

    def __setstate__(self, state: Dict[str, Any]) -> None:
        noise = state.pop('_noise_state')
        super().__setstate__(state)
        self._generator.set_state(noise)


DISCARDED = ('bSAM discarded the gradient your backward left at w and ran the closure at w + eps for its first pass '
             '(its first pass is at noisy weights): give the model (model=..., as timm\'s create_optimizer_v2 does) so '
             'that your forward sees them, or let step(closure) run both passes')
_AT_THE_MEAN = ('bSAM: {call} found the weights at w, not at w + eps: its first pass must run at the noisy weights. '
                'Give the model (model=..., as timm\'s create_optimizer_v2 does), so that its first training forward '
                'after a step displaces them, or let step(closure) run both passes')


def register_bsam_optimizer(registry: Optional[OptimizerRegistry] = None) -> None:
    """Register ``bsam`` with timm's factory (``registry``: default, the one behind ``create_optimizer_v2``), once:
    ``create_optimizer_v2(model, 'bsam', lr=0.5, weight_decay=2e-4, num_data=50000)``."""
    if registry is None:
        registry = default_optimizer_registry()
    if 'bsam' in registry_optimizers(registry):
        return
    registry.register(OptimInfo(
        name='bsam',
        opt_class=BSAM,
        description='bSAM (Bayesian SAM, Möllenhoff & Khan 2023): a Gaussian over the weights, two passes; '
                    'needs num_data=<training set size>',
        has_eps=False,
        has_momentum=False,
        has_betas=True,
        num_betas=2,
    ))
