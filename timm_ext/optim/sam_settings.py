"""The settings of the SAM family, each declared once: SAM's, and each variant's extending it (GSAM, LookSAM, WSAM,
FriendlySAM, SAM-ON, ESAM, Momentum-SAM, bSAM).

A setting is one field of a frozen dataclass; everything else derives from the fields:

* validation (each field's ``check`` in its metadata, plus a family's checks across fields);
* where the value lives: ``group=True`` fields are parameter-group defaults (a group may carry its own
  ``rho``), the others travel in the state dict's ``"sam"`` entry, in copies and pickles, in ``repr`` and
  in the log line of settings a loaded checkpoint changes;
* ``sam_opt_kwargs()``: every optimizer keyword the SAM family takes and a base optimizer does not;
* ``problems()``: what building the settings would refuse, one line each, before anything is built (the
  pre-flight of a recipe's ``opt_kwargs``, through :func:`timm_ext.optim.sam_factory.sam_kwargs_problems`).

Adding a setting: one field (with its ``check``) in the family's dataclass, the argument in the family's
``__init__`` signature (hand-written, so ``help()`` and an IDE show it), plus its test;
``tests/test_sam_settings.py`` checks that every signature and every field agree.
"""
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

from timm_ext.arg_types import is_positive_int

__all__ = ['ASAM_ETA', 'BSAMSettings', 'BSAM_DAMPING', 'BSAM_RHO', 'BSAM_S_INIT', 'BSAM_WEIGHT_DECAY',
           'ESAMSettings', 'ESAM_FRACTION', 'FRIENDLYSAM_LMBDA', 'FRIENDLYSAM_SIGMA', 'FriendlySAMSettings',
           'GSAMSettings', 'GSAM_ALPHA', 'GSAM_RHO_MAX', 'GSAM_RHO_MIN', 'LOOKSAM_ALPHA', 'LOOKSAM_INTERVAL',
           'LookSAMSettings', 'MSAM_RHO', 'MomentumSAMSettings', 'SAMONSettings', 'SAMSettings', 'SAM_RHO',
           'WSAMSettings', 'WSAM_GAMMA', 'sam_opt_kwargs']

SAM_RHO = 0.05
ASAM_ETA = 0.01  # ASAM paper's offset in T = |w| + eta (davda54/sam's constructor form: 0, see SAM)
# GSAM paper, Table 4, ResNet-50/101 on ImageNet (the ViT/Mixer values are per model: see docs/sam.md)
GSAM_RHO_MAX = 0.04
GSAM_RHO_MIN = 0.02
GSAM_ALPHA = 0.01
LOOKSAM_ALPHA = 0.7  # pytorch_optimizer.LookSAM's default (the paper's Algorithm 1 leaves it a hyper-parameter)
LOOKSAM_INTERVAL = 5
WSAM_GAMMA = 0.9  # pytorch_optimizer.WSAM's default: sharpness weighted gamma / (1 - gamma) = 9 against the loss
FRIENDLYSAM_SIGMA = 1.0  # F-SAM paper (Li et al., CVPR 2024) and pytorch_optimizer.FriendlySAM: the whole momentum
FRIENDLYSAM_LMBDA = 0.9  # pytorch_optimizer.FriendlySAM's default EMA decay of the batch gradients
MSAM_RHO = 3.0  # MarlonBecker/MSAM README: --rho 3 for every MSAM and AdamW_MSAM run (SAM's runs there: 0.2)
# bSAM (team-approx-bayes/bayesian-sam): its README's CIFAR runs use --rho 0.01; its weight decay is priorprec / N,
# 40 / (50000 images x dafactor 4) there; its train.py's defaults --custominit 1.0 (s_init) and --damping 0.1
BSAM_RHO = 0.01
BSAM_WEIGHT_DECAY = 2e-4
BSAM_S_INIT = 1.0
BSAM_DAMPING = 0.1
ESAM_FRACTION = 0.5  # dydjw9/Efficient_SAM run.sh: beta = gamma = 0.5 (the weights kept; the samples: see ESAM)
CLIP_MODES = ('norm', 'value', 'agc')


# ---- one check per kind of value: each raises a one-line ValueError, a caller appends where it was found ----

def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_radius(value: Any) -> bool:
    return _is_number(value) and value >= 0 and not math.isinf(value)


def check_rho(rho: Any) -> None:
    if not _is_radius(rho):
        raise ValueError(f'SAM rho must be a finite number >= 0, got rho={rho!r}')


def check_adaptive(adaptive: Any) -> None:
    if adaptive not in (True, False):  # 1 and 0 too, as bool() reads them; not a string such as 'false'
        raise ValueError(f'SAM adaptive must be True or False, got adaptive={adaptive!r}')


def check_eta(eta: Any) -> None:
    if not _is_number(eta) or not eta >= 0:
        raise ValueError(f'SAM eta must be >= 0, got eta={eta!r}')


def check_clip_grad(clip_grad: Any) -> None:
    if clip_grad is not None and (not _is_number(clip_grad) or not clip_grad > 0):
        raise ValueError(f'SAM clip_grad must be > 0 or None, got clip_grad={clip_grad!r}')


def check_clip_mode(clip_mode: Any) -> None:
    if clip_mode not in CLIP_MODES:
        raise ValueError(f'SAM clip_mode must be one of {CLIP_MODES}, got clip_mode={clip_mode!r}')


def check_interval(interval: Any) -> None:
    if not is_positive_int(interval):
        raise ValueError(f'SAM interval must be an integer >= 1 (a SAM step every interval-th step), '
                         f'got interval={interval!r}')


def check_use_gc(use_gc: Any) -> None:
    if use_gc not in (True, False):
        raise ValueError(f'SAM use_gc must be True or False, got use_gc={use_gc!r}')


def check_m_sharpness(m_sharpness: Any) -> None:
    if m_sharpness is None:
        return
    if not is_positive_int(m_sharpness):
        raise ValueError(f'SAM m_sharpness must be a positive integer (images per perturbation) or None, '
                         f'got m_sharpness={m_sharpness!r}')


def _check_alpha(family: str) -> Callable[[Any], None]:
    def check_alpha(alpha: Any) -> None:
        if not _is_number(alpha) or not 0 <= alpha < 1:
            raise ValueError(f'{family} alpha must be in [0, 1), got alpha={alpha!r}')
    return check_alpha


def _check_gamma(gamma: Any) -> None:
    if not _is_number(gamma) or not 0 <= gamma < 1:
        raise ValueError(f'WSAM gamma must be in [0, 1) (the sharpness weighs gamma / (1 - gamma)), '
                         f'got gamma={gamma!r}')


def _check_decouple(decouple: Any) -> None:
    if decouple not in (True, False):
        raise ValueError(f'WSAM decouple must be True or False, got decouple={decouple!r}')


def _check_sigma(sigma: Any) -> None:
    if not _is_radius(sigma):
        raise ValueError(f'FriendlySAM sigma must be a finite number >= 0, got sigma={sigma!r}')


def _check_lmbda(lmbda: Any) -> None:
    if not _is_number(lmbda) or not 0 <= lmbda <= 1:
        raise ValueError(f'FriendlySAM lmbda must be in [0, 1] (the momentum\'s decay), got lmbda={lmbda!r}')


def _check_only_norm(only_norm: Any) -> None:
    if only_norm not in (True, False):
        raise ValueError(f'SAM-ON only_norm must be True or False, got only_norm={only_norm!r}')


def _check_fraction(family: str, name: str) -> Callable[[Any], None]:
    def check_fraction(value: Any) -> None:
        if not _is_number(value) or not 0 < value <= 1:
            raise ValueError(f'{family} {name} must be in (0, 1], got {name}={value!r}')
    return check_fraction


def _check_seed(family: str, what: str) -> Callable[[Any], None]:
    def check_seed(seed: Any) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f'{family} seed must be an int >= 0 ({what}), got seed={seed!r}')
    return check_seed


def _check_num_data(num_data: Any) -> None:
    if isinstance(num_data, bool) or not isinstance(num_data, int) or num_data <= 0:
        raise ValueError(f'bSAM needs num_data=<training set size> (an int > 0: the noise\'s variance is '
                         f'1 / (num_data * s)), got num_data={num_data!r}')


def _check_bsam_rho(rho: Any) -> None:
    if not _is_radius(rho):
        raise ValueError(f'bSAM rho must be a finite number >= 0, got rho={rho!r}')


def _check_s_init(s_init: Any) -> None:
    if not _is_number(s_init) or not 0 < s_init < math.inf:
        raise ValueError(f'bSAM s_init must be a finite number > 0 (the initial precision), got s_init={s_init!r}')


def _check_damping(damping: Any) -> None:
    if not _is_radius(damping):
        raise ValueError(f'bSAM damping must be a finite number >= 0, got damping={damping!r}')


def _check_gsam_radius(name: str) -> Callable[[Any], None]:
    def check_radius(value: Any) -> None:
        if not _is_radius(value):
            raise ValueError(f'GSAM {name} must be a finite number >= 0, got {name}={value!r}')
    return check_radius


_check_rho_max, _check_rho_min = _check_gsam_radius('rho_max'), _check_gsam_radius('rho_min')


def _check_lr_min(lr_min: Any) -> None:
    if not _is_number(lr_min) or not lr_min >= 0:
        raise ValueError(f'GSAM lr_min must be a number >= 0, got lr_min={lr_min!r}')


def _no_check(value: Any) -> None:
    """A setting whose value is checked with the others (``_check_together``) or accepts anything."""


def setting(default: Any, check: Callable[[Any], None], group: bool = False, init: bool = True) -> Any:
    """One setting: its default, its check, and whether it is a parameter-group default (``group``)."""
    return field(default=default, init=init, metadata={'check': check, 'group': group})


def _with_where(check: Callable[[Any], None], value: Any, where: str) -> None:
    try:
        check(value)
    except ValueError as error:
        raise ValueError(f'{error}{where}') from None


@dataclass(frozen=True)
class SAMSettings:
    """SAM's settings (see :class:`timm_ext.optim.SAM` for what each one does)."""
    rho: float = setting(SAM_RHO, check_rho, group=True)
    adaptive: bool = setting(False, check_adaptive, group=True)
    eta: float = setting(ASAM_ETA, check_eta, group=True)
    clip_grad: Optional[float] = setting(None, check_clip_grad)
    clip_mode: str = setting('norm', check_clip_mode)
    interval: int = setting(1, check_interval)
    m_sharpness: Optional[int] = setting(None, check_m_sharpness)
    use_gc: bool = setting(False, check_use_gc)

    family = 'SAM'

    def __post_init__(self) -> None:
        self._check_together()
        for f in dataclasses.fields(self):
            if f.init:
                f.metadata['check'](getattr(self, f.name))
        object.__setattr__(self, 'adaptive', bool(self.adaptive))
        object.__setattr__(self, 'use_gc', bool(self.use_gc))

    def _check_together(self) -> None:
        """Checks across fields (run before the per-field ones)."""

    @classmethod
    def check_group(cls, group: Dict[str, Any], where: str) -> None:
        """Check a parameter group's own values of the per-group settings where it carries them (GSAM's group
        rho is its rho_t, checked as a rho); ``where`` ends the message (' in param group 1')."""
        for f in dataclasses.fields(cls):
            if f.metadata['group'] and f.name in group:
                _with_where(f.metadata['check'], group[f.name], where)

    @classmethod
    def problems(cls, **values: Any) -> List[str]:
        """What ``cls(**values)`` refuses, in its own words, one line each, without building an optimizer: each
        given setting's check (every bad value named at once), then, when those pass, the constructor itself (the
        checks across settings). The pre-flight of ``opt_kwargs`` runs this, so a recipe is refused with the text
        the optimizer would raise."""
        checks = {f.name: f.metadata['check'] for f in dataclasses.fields(cls) if f.init}
        problems = []
        for name, value in values.items():
            try:
                checks[name](value)
            except ValueError as error:
                problems.append(str(error))
        if not problems:
            try:
                cls(**values)
            except ValueError as error:
                problems.append(str(error))
        return problems

    @classmethod
    def checked(cls, where: str = '', **values: Any) -> 'SAMSettings':
        """Build and check; ``where`` ends every error message (' in the loaded state dict')."""
        try:
            return cls(**values)
        except ValueError as error:
            raise ValueError(f'{error}{where}') from None

    # ---- what derives from the fields ----------------------------------------------------------------

    @classmethod
    def init_names(cls) -> Tuple[str, ...]:
        """Every setting a user gives, in field order."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.init)

    @classmethod
    def group_names(cls) -> Tuple[str, ...]:
        """Settings given per parameter group (a loaded group that changes one is logged)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.init and f.metadata['group'])

    @classmethod
    def optimizer_names(cls) -> Tuple[str, ...]:
        """Settings of the optimizer as a whole: its state-dict entry, its repr, the logged changes."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.init and not f.metadata['group'])

    def group_defaults(self) -> Dict[str, Any]:
        """What every parameter group gets unless it has its own value."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata['group']}

    def optimizer_values(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self.optimizer_names()}

    def replace(self, where: str = '', **changes: Any) -> 'SAMSettings':
        """These settings with ``changes``, checked (``where`` ends an error message)."""
        values = {name: getattr(self, name) for name in self.init_names()}
        values.update(changes)
        return type(self).checked(where, **values)


@dataclass(frozen=True)
class GSAMSettings(SAMSettings):
    """GSAM's settings: SAM's, with the radius scheduled between ``rho_min`` and ``rho_max`` by the lr."""
    rho_max: float = setting(GSAM_RHO_MAX, _check_rho_max)
    rho_min: float = setting(GSAM_RHO_MIN, _check_rho_min)
    alpha: float = setting(GSAM_ALPHA, _check_alpha('GSAM'))
    lr_max: Optional[float] = setting(None, _no_check)
    lr_min: float = setting(0.0, _check_lr_min)
    rho: float = setting(GSAM_RHO_MAX, check_rho, group=True, init=False)  # each step's rho_t: not given

    family = 'GSAM'

    def __post_init__(self) -> None:
        object.__setattr__(self, 'rho', self.rho_max)
        super().__post_init__()
        object.__setattr__(self, 'lr_min', float(self.lr_min))
        if self.lr_max is not None:
            object.__setattr__(self, 'lr_max', float(self.lr_max))

    def _check_together(self) -> None:
        _check_rho_max(self.rho_max)  # before they are compared
        _check_rho_min(self.rho_min)
        if self.rho_min > self.rho_max:
            raise ValueError(f'GSAM rho_min must be <= rho_max, got rho_min={self.rho_min!r} > '
                             f'rho_max={self.rho_max!r}')
        _check_lr_min(self.lr_min)
        lr_max = self.lr_max
        if lr_max is not None and (not _is_number(lr_max) or not lr_max >= self.lr_min):
            raise ValueError(f'GSAM lr_max must be >= lr_min={self.lr_min!r} or None (the initial lr), '
                             f'got lr_max={lr_max!r}')


@dataclass(frozen=True)
class LookSAMSettings(SAMSettings):
    """LookSAM's settings: SAM's, with ``alpha`` (weight of the reused direction) and a SAM step every
    ``interval`` (k) steps."""
    rho: float = setting(SAM_RHO, check_rho, group=True)
    alpha: float = setting(LOOKSAM_ALPHA, _check_alpha('LookSAM'))
    interval: int = setting(LOOKSAM_INTERVAL, check_interval)

    family = 'LookSAM'


@dataclass(frozen=True)
class WSAMSettings(SAMSettings):
    """WSAM's settings: SAM's, with ``gamma`` (the sharpness weighs ``gamma / (1 - gamma)`` against the loss) and
    ``decouple`` (the sharpness term as its own weight update after the base step, not in the base's gradient)."""
    gamma: float = setting(WSAM_GAMMA, _check_gamma)
    decouple: bool = setting(True, _check_decouple)

    family = 'WSAM'


@dataclass(frozen=True)
class FriendlySAMSettings(SAMSettings):
    """FriendlySAM's settings: SAM's, with ``sigma`` (how much of the gradients' momentum the perturbation leaves
    out) and ``lmbda`` (that momentum's decay)."""
    sigma: float = setting(FRIENDLYSAM_SIGMA, _check_sigma)
    lmbda: float = setting(FRIENDLYSAM_LMBDA, _check_lmbda)

    family = 'FriendlySAM'


@dataclass(frozen=True)
class SAMONSettings(SAMSettings):
    """SAM-ON's settings: SAM's, with ``only_norm`` (the perturbation moves only the normalization layers'
    parameters; False: every parameter, SAM)."""
    only_norm: bool = setting(True, _check_only_norm)

    family = 'SAM-ON'


@dataclass(frozen=True)
class ESAMSettings(SAMSettings):
    """ESAM's settings: SAM's, with ``weight_fraction`` (each parameter tensor is perturbed with this probability,
    the radius divided by it) and ``data_fraction`` (the second pass runs on this fraction of the batch: the samples
    whose loss the perturbation raised most); ``seed`` draws the weights, the same on every process."""
    weight_fraction: float = setting(ESAM_FRACTION, _check_fraction('ESAM', 'weight_fraction'))
    data_fraction: float = setting(1.0, _check_fraction('ESAM', 'data_fraction'))  # step(closure) takes only 1
    seed: int = setting(0, _check_seed('ESAM', 'the draw of the perturbed tensors'))

    family = 'ESAM'

    def _check_together(self) -> None:
        if self.m_sharpness is not None and _is_number(self.data_fraction) and self.data_fraction < 1:
            raise ValueError(f'ESAM data_fraction={self.data_fraction!r} cannot be combined with m_sharpness: each '
                             f'chunk would need its own selection; use one of them')


@dataclass(frozen=True)
class MomentumSAMSettings(SAMSettings):
    """Momentum-SAM's settings: ``rho`` (the gradient is taken at ``w - rho v / ||v||``, v the base optimizer's
    momentum), ``clip_grad`` and ``clip_mode``; it has no second pass, so nothing of SAM's about one applies."""
    rho: float = setting(MSAM_RHO, check_rho, group=True)
    adaptive: bool = setting(False, _no_check, group=True, init=False)
    eta: float = setting(ASAM_ETA, _no_check, group=True, init=False)
    interval: int = setting(1, _no_check, init=False)
    m_sharpness: Optional[int] = setting(None, _no_check, init=False)
    use_gc: bool = setting(False, _no_check, init=False)

    family = 'Momentum-SAM'


@dataclass(frozen=True)
class BSAMSettings(SAMSettings):
    """bSAM's settings: ``rho`` (the ascent ``rho g / s``), ``num_data`` (N, required), ``s_init`` and ``damping``
    (the precision's start and damping; per param group, as the base's lr), ``seed`` (the noise generator's),
    ``clip_grad`` and ``clip_mode``. SAM's ``adaptive``, ``eta``, ``interval``, ``m_sharpness`` and ``use_gc`` are not
    bSAM's (``BSAM`` refuses them)."""
    rho: float = setting(BSAM_RHO, _check_bsam_rho, group=True)
    adaptive: bool = setting(False, _no_check, group=True, init=False)
    eta: float = setting(ASAM_ETA, _no_check, group=True, init=False)
    interval: int = setting(1, _no_check, init=False)
    m_sharpness: Optional[int] = setting(None, _no_check, init=False)
    use_gc: bool = setting(False, _no_check, init=False)
    num_data: Optional[int] = setting(None, _check_num_data)
    s_init: float = setting(BSAM_S_INIT, _check_s_init, group=True)
    damping: float = setting(BSAM_DAMPING, _check_damping, group=True)
    seed: int = setting(0, _check_seed('bSAM', 'the noise generator\'s'))

    family = 'bSAM'


FAMILIES: Tuple[Type[SAMSettings], ...] = (SAMSettings, GSAMSettings, LookSAMSettings, WSAMSettings,
                                           FriendlySAMSettings, SAMONSettings, ESAMSettings, MomentumSAMSettings,
                                           BSAMSettings)


def sam_opt_kwargs() -> Tuple[str, ...]:
    """Every optimizer keyword a SAM-family optimizer takes from timm's factory (``opt_kwargs`` of a recipe)
    and a plain base optimizer does not: ``base`` and each family's settings, in declaration order.

    A recipe that swaps its SAM optimizer for a plain one (``--opt adamw``) but keeps one of these
    in ``opt_kwargs`` would fail in the base optimizer (or, for ``alpha``, change RMSprop's meaning).
    """
    names = ['base']
    for family in FAMILIES:
        names.extend(n for n in family.init_names() if n not in names)
    return tuple(names)
