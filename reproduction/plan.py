"""What the reproduction study trains and what it claims, each revision written down before its runs (issue 21).

Every arm is one timm ``train.py`` run per seed on the 16 px digits (the demo's data and ViT), with
the vit-sam paper's basic regime: a random-resized ("Inception-style") crop and nothing else, no
mixup, RandAugment, colour jitter or random erasing. Horizontal flip is off because a mirrored digit
is another glyph. Arms that share an architecture share their initial weights and data order for a
given seed (train.py seeds the model and the loader with ``--seed``; nothing here draws randomness
differently between them), so each comparison is paired by seed.

``CLAIMS`` fixes, for each claim, the two arms (or one arm against zero), the direction the paper
predicts and the smallest effect that matters (``margin``); the verdict follows
:func:`timm_ext.analysis.stats.verdict`. ``CONVERGED_GAIN`` is the convergence criterion. Each revision is data
(``PLANS``): the arms it trains, the seeds they train at, its claims and the seeds each is read at, its rules, and
its decision in the words written before its runs (``RevisionPlan.decided``); one job planner, one claims reader
and one report writer serve them all. Whether a revision counts as registered is not its own word:
``registration.py`` holds the record (commit, first run, what it had seen) and the one standard that labels it
(issue 57).
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple

IMAGE_SIZE = 16
VIT = dict(img_size=IMAGE_SIZE, patch_size=4, embed_dim=128, depth=4, num_heads=4)  # the demo's ViT
CNN = dict(channels=(16, 32, 64, 128), num_heads=(1, 2, 4, 8), head_dim=16, stem_chs=16)  # ResNet-18 shapes / 4
BASE_LR = 1e-3
EPOCHS = 30  # the CNNs' schedule on the full training set; a subset trains for EPOCHS / fraction epochs (same steps)
VIT_EPOCHS = 60  # the ViTs' schedule (revision 2.1; v2 trained them for EPOCHS)
SEEDS = (0, 1, 2, 3, 4)
# revision 2.4: pairs trained seed by seed until both runs meet the rule (schedule doubled up to MAX_DOUBLINGS times)
EXTENDED_PAIRS = (('vit_lr1.5e-3', 'vit_convstem_lr1.5e-3'),)
MAX_DOUBLINGS = 2  # 60 -> 120 -> 240 epochs
# revision 3.1: at revision 3's new seeds, these arms train a seed again at twice the schedule, all of them, where
# one of the seed's runs misses the rule (vit_convstem only at the seeds it is read at)
EXTENDED_GROUP = ('vit', 'vit_sam', 'vit_convstem')
SAM_RHO = 0.05
MEASURE_FILE = 'timm_ext_measurements.json'  # each run's measurements (_repro_measure), in its folder
CPU_FILE = 'timm_ext_cpu.json'  # each run's CPU seconds (train + measure, study_jobs), lanes and cores, in its folder
WEIGHT_DECAY = 0.05

# train.py settings of every run; --lr, --epochs and --seed are each run's
TRAIN_ARGS = (
    '--num-classes', '10', '--input-size', '3', str(IMAGE_SIZE), str(IMAGE_SIZE), '--crop-pct', '1.0',
    '--mean', '0.5', '0.5', '0.5', '--std', '0.5', '0.5', '0.5', '--interpolation', 'bilinear',
    '--train-interpolation', 'bilinear', '--scale', '0.6', '1.0', '--ratio', '0.8', '1.25',
    '--hflip', '0', '--color-jitter', '0', '--smoothing', '0.1',
    '--batch-size', '16', '--validation-batch-size', '128', '--weight-decay', str(WEIGHT_DECAY),
    '--sched', 'cosine', '--sched-on-updates', '--warmup-epochs', '1', '--warmup-lr', '1e-5', '--min-lr', '0',
    '--workers', '0', '--log-interval', '1000', '--checkpoint-hist', '1', '--device', 'cpu',
)

# revision 3: claims read at more seeds than SEEDS, each number fixed before the runs from the 5 seeds (power.py)
POWER = 0.8  # the chance of a conclusive verdict the numbers of seeds are chosen for
REACH = 20  # the most seeds a revision-3 claim may get (this study's CPU on 2 cores)
EXTENDED_SEEDS = {'sam_vit_top1': 16, 'sam_active_neurons': 16, 'sam_vit_gain_larger': 14, 'stem_lr_1e-3': 9}

# revision 4: the ViT pair at twice VIT_EPOCHS for every seed of the headline claim, read once as a claim of its own
LONG_PAIR = ('vit', 'vit_sam')
LONG_FACTOR = 2  # 60 -> 120 epochs: longer_schedules.doubled(arm, 1), the runs <arm>_x2-s<seed>
LONG_SEEDS = tuple(range(EXTENDED_SEEDS['sam_vit_top1']))
LONG_REUSED = (6, 12, 14)  # trained at these settings by revision 3.1: read back, not trained again
# revision 4's fifth label: an interval on the claimed side of 0 and inside the margin reads "smaller than claimed"
SMALLER_THAN_CLAIMED = True


# A run has converged when the best validation top-1 of its last CONVERGED_TAIL of epochs beats the best
# before them by at most CONVERGED_GAIN points (2 of the 359 validation images).
CONVERGED_TAIL = 0.2
CONVERGED_GAIN = 0.6

# the measurement sets an arm gets (training runs are the same for all)
VIT_ALL, VIT_SAM, CNN_ALL, CURVE = 'vit', 'vit_sam', 'cnn', 'curve'


@dataclass(frozen=True)
class Arm:
    """One trained configuration: model, optimizer, lr and training-set fraction, and what is measured on it."""
    name: str
    label: str
    model: str
    model_kwargs: Dict[str, Any]
    opt: str = 'adamw'
    opt_kwargs: Dict[str, Any] = field(default_factory=dict)
    lr: float = BASE_LR
    fraction: float = 1.0
    measure: str = VIT_ALL
    schedule: int = VIT_EPOCHS  # epochs on the full training set
    weight_decay: Optional[float] = None  # train.py's --weight-decay where the arm's optimizer needs its own
    step_cost: Optional[float] = None  # a step's time over AdamW's, for the ETA (None: SAM 1.9, the rest 1)

    @property
    def epochs(self) -> int:
        return int(round(self.schedule / self.fraction))

    @property
    def cost(self) -> float:
        """Relative CPU time of one run (the plain ViT on the full data = 1): the ETA's model."""
        per_epoch = {'vit_tiny_convstem': 1.2, 'alternet_18_nomsa_cifar': 0.75, 'alternet_18_cifar': 0.8}
        sam = self.step_cost if self.step_cost is not None else 1.9 if self.opt.startswith('sam') else 1.0
        measure = {VIT_ALL: 0.35, VIT_SAM: 0.3, CNN_ALL: 0.3, CURVE: 0.0}[self.measure]
        steps = self.schedule / EPOCHS
        return per_epoch.get(self.model, 1.0) * sam * (1.0 + 0.05 * (1 / self.fraction - 1)) * steps + measure


_SAM = dict(rho=SAM_RHO)
ARMS: Tuple[Arm, ...] = (
    Arm('vit', 'ViT + AdamW', 'vit_tiny_patch16_224', VIT),
    Arm('vit_sam', 'ViT + SAM', 'vit_tiny_patch16_224', VIT, 'samadamw', _SAM),
    Arm('resnet', 'pre-act ResNet-18/4 + AdamW', 'alternet_18_nomsa_cifar', CNN, measure=CNN_ALL, schedule=EPOCHS),
    Arm('resnet_sam', 'pre-act ResNet-18/4 + SAM', 'alternet_18_nomsa_cifar', CNN, 'samadamw', _SAM,
        measure=CNN_ALL, schedule=EPOCHS),
    Arm('alternet', 'AlterNet-18/4 + AdamW', 'alternet_18_cifar', CNN, measure=CNN_ALL, schedule=EPOCHS),
    Arm('vit_cb', 'ViT + CB (blocks 3-4)', 'vit_tiny_cb', VIT),
    Arm('vit_convstem', 'ViT conv stem + AdamW', 'vit_tiny_convstem', VIT),
    Arm('vit_half', 'ViT + AdamW, 1/2 data', 'vit_tiny_patch16_224', VIT, fraction=0.5, measure=VIT_SAM),
    Arm('vit_sam_half', 'ViT + SAM, 1/2 data', 'vit_tiny_patch16_224', VIT, 'samadamw', _SAM, fraction=0.5,
        measure=VIT_SAM),
    Arm('vit_quarter', 'ViT + AdamW, 1/4 data', 'vit_tiny_patch16_224', VIT, fraction=0.25, measure=VIT_SAM),
    Arm('vit_sam_quarter', 'ViT + SAM, 1/4 data', 'vit_tiny_patch16_224', VIT, 'samadamw', _SAM, fraction=0.25,
        measure=VIT_SAM),
    Arm('vit_lr1.5e-3', 'ViT (patchify), lr 1.5e-3', 'vit_tiny_patch16_224', VIT, lr=1.5e-3, measure=CURVE),
    Arm('vit_convstem_lr1.5e-3', 'ViT conv stem, lr 1.5e-3', 'vit_tiny_convstem', VIT, lr=1.5e-3, measure=CURVE),
)
ARM_BY_NAME = {a.name: a for a in ARMS}


@dataclass(frozen=True)
class Claim:
    """One claim of a paper as a paired comparison: ``b - a`` per seed, in the predicted ``direction``.

    ``a`` may be None: ``b``'s own value against zero (a one-sample claim such as "the MSA blocks lower the
    variance": log ratio < 0). ``metric`` names a per-run quantity of the report's ``METRICS``; ``gain_of``
    makes it a difference of differences (SAM's gain of one pair against another's). ``direction``
    'unchanged' claims no effect: reproduced when the interval lies inside ``(-margin, margin)``.
    """
    key: str
    paper: str
    source: str
    text: str
    metric: str
    a: Any
    b: Any
    direction: str
    margin: float
    unit: str = ''


CLAIMS: Tuple[Claim, ...] = (
    # vit-sam: Sec. 4 / Table 2, Table 5, Table 1, Sec. 4.3 Fig. 2
    Claim('sam_vit_top1', 'vit-sam', 'Sec. 4, Table 2', 'SAM raises the ViT\'s top-1', 'top1', 'vit', 'vit_sam',
          'increase', 1.0, ' pt'),
    Claim('sam_resnet_top1', 'vit-sam', 'Table 2', 'SAM raises the ResNet\'s top-1', 'top1', 'resnet',
          'resnet_sam', 'increase', 1.0, ' pt'),
    Claim('sam_vit_gain_larger', 'vit-sam', 'Sec. 4, Table 2', 'SAM\'s top-1 gain is larger for the ViT than for '
          'the ResNet', 'top1', ('resnet', 'resnet_sam'), ('vit', 'vit_sam'), 'increase', 1.0, ' pt'),
    Claim('sam_gain_half', 'vit-sam', 'Table 5', 'SAM\'s top-1 gain on the ViT grows with 1/2 of the data',
          'top1', ('vit', 'vit_sam'), ('vit_half', 'vit_sam_half'), 'increase', 1.0, ' pt'),
    Claim('sam_gain_quarter', 'vit-sam', 'Table 5', 'SAM\'s top-1 gain on the ViT grows with 1/4 of the data',
          'top1', ('vit', 'vit_sam'), ('vit_quarter', 'vit_sam_quarter'), 'increase', 1.0, ' pt'),
    Claim('sam_lambda_max', 'vit-sam', 'Table 1', 'SAM lowers the ViT\'s lambda_max (log scale)',
          'log_lambda_max', 'vit', 'vit_sam', 'decrease', 0.1),
    Claim('sam_noisy_loss', 'vit-sam', 'Table 1', 'SAM lowers the ViT\'s L_train^N', 'noisy_loss', 'vit',
          'vit_sam', 'decrease', 0.05),
    Claim('sam_active_neurons', 'vit-sam', 'Sec. 4.3, Fig. 2', 'SAM lowers the share of active neurons in the '
          'ViT\'s first block', 'active_first', 'vit', 'vit_sam', 'decrease', 0.01),
    # scaled-relu: Table 1 (lr robustness), Sec. 4 (early convergence), Fig. 1 (token similarity)
    Claim('stem_lr_1e-3', 'scaled-relu', 'Table 1', 'at lr 1e-3 the conv stem reaches a higher top-1 than '
          'patchify', 'top1', 'vit', 'vit_convstem', 'increase', 1.0, ' pt'),
    Claim('stem_lr_1.5e-3', 'scaled-relu', 'Table 1', 'at lr 1.5e-3 the conv stem reaches a higher top-1 than '
          'patchify', 'top1', 'vit_lr1.5e-3', 'vit_convstem_lr1.5e-3', 'increase', 1.0, ' pt'),
    Claim('stem_early', 'scaled-relu', 'Sec. 4 (18.1 vs 10.6 % at epoch 5)', 'the conv stem converges faster: '
          'top-1 after 1/10 of the epochs', 'top1_early', 'vit', 'vit_convstem', 'increase', 1.0, ' pt'),
    Claim('stem_tokens', 'scaled-relu', 'Fig. 1', 'the conv stem lowers the token similarity after the stem',
          'token_similarity_stem', 'vit', 'vit_convstem', 'decrease', 0.02),
    # context broadcasting: Fig. 7a (entropy), Fig. 7b (distance), top-1
    Claim('cb_entropy_cls', 'context-broadcasting', 'Fig. 7a', 'CB lowers the class token\'s attention entropy '
          'in the CB layers', 'entropy_cls_deep', 'vit', 'vit_cb', 'decrease', 0.05, ' nats'),
    Claim('cb_entropy_all', 'context-broadcasting', 'Fig. 7a', 'CB lowers the attention entropy (all queries) '
          'in the CB layers', 'entropy_all_deep', 'vit', 'vit_cb', 'decrease', 0.05, ' nats'),
    Claim('cb_distance', 'context-broadcasting', 'Fig. 7b', 'CB leaves the mean attention distance unchanged',
          'distance_deep', 'vit', 'vit_cb', 'unchanged', 0.02),
    Claim('cb_top1', 'context-broadcasting', 'Tables 1-2', 'CB raises top-1', 'top1', 'vit', 'vit_cb',
          'increase', 1.0, ' pt'),
    # how-do-vits-work: Fig. 9 (variance), Fig. 8 (high frequencies), Fig. 4 / 1c (Hessian spectra)
    Claim('msa_variance', 'how-do-vits-work', 'Fig. 9', 'AlterNet\'s MSA blocks lower the feature-map variance '
          '(log ratio after / before < 0)', 'msa_log_variance_ratio', None, 'alternet', 'decrease', 0.05),
    Claim('msa_lowpass', 'how-do-vits-work', 'Fig. 8', 'AlterNet\'s MSA blocks lower the high-frequency '
          'amplitude (change of Delta log amplitude at pi < 0)', 'msa_delta_pi', None, 'alternet', 'decrease',
          0.05),
    Claim('hessian_vit_nep', 'how-do-vits-work', 'Fig. 4 left', 'the ViT has more negative Hessian max '
          'eigenvalues than the ResNet (NEP)', 'nep', 'resnet', 'vit', 'increase', 0.05),
    Claim('hessian_vit_ape', 'how-do-vits-work', 'Fig. 4 right', 'the ViT\'s positive Hessian max eigenvalues '
          'are smaller than the ResNet\'s (log APE)', 'log_ape', 'resnet', 'vit', 'decrease', 0.1),
    Claim('hessian_small_data_nep', 'how-do-vits-work', 'Fig. 4 (dotted)', 'less data gives the ViT more '
          'negative eigenvalues (NEP, 1/4 vs all of the data)', 'nep', 'vit', 'vit_quarter', 'increase', 0.05),
    Claim('alternet_ape', 'how-do-vits-work', 'Fig. 1c, 12c', 'AlterNet\'s MSAs lower the positive Hessian max '
          'eigenvalues against the pre-act ResNet (log APE)', 'log_ape', 'resnet', 'alternet', 'decrease', 0.1),
)

# revision 4: the pair at 120 epochs, read once at LONG_SEEDS (the arms are the doubled ones of LONG_PAIR)
LONG_CLAIM = Claim('sam_vit_top1_120', 'vit-sam', 'Sec. 4, Table 2', 'SAM raises the ViT\'s top-1 at 120 epochs',
                   'top1', 'vit_x2', 'vit_sam_x2', 'increase', 1.0, ' pt')

# The verdicts of docs/reproduction.md v1 (6 epochs, 3 seeds, "holds in every seed"), by claim key; the
# claims v1 did not measure are absent.
V1_VERDICTS = {
    'sam_lambda_max': 'reproduced', 'sam_noisy_loss': 'reproduced', 'sam_active_neurons': 'the opposite',
    'stem_lr_1e-3': 'reproduced', 'stem_early': 'mixed', 'stem_tokens': 'reproduced',
    'cb_entropy_cls': 'the opposite', 'cb_entropy_all': 'the opposite', 'msa_variance': 'the opposite',
    'msa_lowpass': 'reproduced', 'alternet_ape': 'mixed (lambda_max)',
}


def _claim_arms(claim: Claim) -> Tuple[str, ...]:
    return tuple(arm for side in (claim.a, claim.b) if side is not None
                 for arm in (side if isinstance(side, tuple) else (side,)))


def extended_seeds(arm: str) -> Tuple[int, ...]:
    """Revision 3: the seeds beyond ``SEEDS`` that ``arm`` is trained for (the most any extended claim on it reads)."""
    n = max([EXTENDED_SEEDS[c.key] for c in CLAIMS if c.key in EXTENDED_SEEDS and arm in _claim_arms(c)],
            default=len(SEEDS))
    return tuple(range(len(SEEDS), n))


# revision 5 (issue 59): the SAM family at revision 4's schedule, each against revision 4's SAM and AdamW runs
R5_SCHEDULE = VIT_EPOCHS * LONG_FACTOR  # revision 4's 120 epochs
R5_ADAMW, R5_SAM = 'vit_x2', 'vit_sam_x2'  # revision 4's pair at LONG_SEEDS, reused as they are
R5_PILOT_SEEDS = (0, 1, 2)  # stage 1: every arm
R5_REACH = len(LONG_SEEDS)  # the most seeds a claim may get: the reused pair's 16
R5_BUDGET_CPU_MIN = 600.0  # CPU-minutes of new runs (one core each), the pilot's included
R5_MARGIN = 0.5  # points of top-1: between 1 and 2 of the 359 validation images
R5_TRAINS = 50.0  # a pilot run that fails or ends below this top-1 (chance: 10) shows the arm cannot train the model


def _r5(name: str, label: str, opt: str, step_cost: float, lr: float = BASE_LR,
        weight_decay: Optional[float] = None, **opt_kwargs: Any) -> Arm:
    return Arm(name, label, 'vit_tiny_patch16_224', VIT, opt, opt_kwargs, lr=lr, measure=CURVE,
               schedule=R5_SCHEDULE, weight_decay=weight_decay, step_cost=step_cost)


# in the plan's order: the cheap variants first. Each setting is its paper's for ViTs, or the nearest documented one
# (the source beside it); none was tuned on the digits. SAM's own rho is the study's 0.05 (vit-sam).
R5_ARMS: Tuple[Arm, ...] = (
    # ESAM: weight_fraction 0.5, data_fraction 0.5 (the official run.sh); rho SAM's
    _r5('vit_esam_x2', 'ViT + ESAM', 'esamadamw', 1.8, rho=SAM_RHO, weight_fraction=0.5, data_fraction=0.5),
    # MESA: kl_weight 0.8, temperature 5 (the paper's run.sh); the EMA over ~1/100 of the updates and the term from
    # 1/60 of training on, the paper's ImageNet proportions (0.9998 over 750k updates, epoch 5 of 300): 180 updates
    _r5('vit_mesa_x2', 'ViT + MESA', 'mesaadamw', 1.35, kl_weight=0.8, temperature=5.0, ema_decay=0.99,
        start_step=180),
    # Momentum-SAM: rho 3, the official code's value for every AdamW_MSAM run
    _r5('vit_msam_x2', 'ViT + Momentum-SAM', 'msamadamw', 1.05, rho=3.0),
    # LookSAM: k 5, alpha 0.7 (the paper's ViT settings), rho SAM's
    _r5('vit_looksam_x2', 'ViT + LookSAM (k 5)', 'looksamadamw', 1.25, rho=SAM_RHO, interval=5, alpha=0.7),
    # SAM every 10th step at 10x SAM's rho: Composer's SAM method card (interval 10, rho 0.5 against SAM's 0.05)
    _r5('vit_interval_x2', 'ViT + SAM every 10th step', 'samadamw', 1.1, rho=10 * SAM_RHO, interval=10),
    # GSAM: alpha 0.6 and rho_min / rho_max = 1/6 (Table 4, ViT-B/32), rho_max SAM's, over the study's lr schedule
    _r5('vit_gsam_x2', 'ViT + GSAM', 'gsamadamw', 1.9, rho_max=SAM_RHO, rho_min=0.0083, alpha=0.6, lr_max=BASE_LR,
        lr_min=0.0),
    # FriendlySAM: sigma 1, lmbda 0.9 (pytorch-optimizer's defaults, recipes/examples/friendlysam.yaml), rho SAM's
    _r5('vit_friendlysam_x2', 'ViT + FriendlySAM', 'friendlysamadamw', 1.9, rho=SAM_RHO, sigma=1.0, lmbda=0.9),
    # SAM-ON: the normalization layers only, rho SAM's (recipes/examples/samon.yaml)
    _r5('vit_samon_x2', 'ViT + SAM-ON', 'samonadamw', 1.9, rho=SAM_RHO),
    # WSAM: gamma 0.9, decoupled (the paper's Algorithm 1; pytorch-optimizer's defaults), rho SAM's
    _r5('vit_wsam_x2', 'ViT + WSAM', 'wsamadamw', 1.9, rho=SAM_RHO, gamma=0.9, decouple=True),
    # ASAM: rho 0.5, eta 0.01 (the paper's CIFAR settings; it gives none for a ViT)
    _r5('vit_asam_x2', 'ViT + ASAM', 'asamadamw', 1.9, rho=0.5, eta=0.01),
    # GC-SAM: the ascent along the centralized gradient, rho SAM's
    _r5('vit_gcsam_x2', 'ViT + GC-SAM', 'samadamw', 1.9, rho=SAM_RHO, use_gc=True),
    # bSAM: lr 0.5, rho 0.01, s_init 1, damping 0.1 (the official README's CIFAR runs); num_data the 1,438 training
    # images times the official dafactor 4; the prior precision 40 / num_data as the weight decay (its README)
    _r5('vit_bsam_x2', 'ViT + bSAM', 'bsam', 2.0, lr=0.5, weight_decay=0.007, num_data=4 * 1438, rho=0.01,
        s_init=1.0, damping=0.1),
)
# the check before the pilot: revision 4's AdamW run at seed 0 again, under a name of its own (the cache keeps both)
R5_CHECK = (Arm('vit_x2_check', 'ViT + AdamW, 120 epochs (check)', 'vit_tiny_patch16_224', VIT, measure=CURVE,
                schedule=R5_SCHEDULE), 0)
R5_CHEAP = ('vit_esam_x2', 'vit_mesa_x2', 'vit_msam_x2', 'vit_looksam_x2', 'vit_interval_x2')


def _r5_claim(arm: Arm, paper: str, source: str) -> Claim:
    name = arm.label[len('ViT + '):]
    if arm.name in R5_CHEAP:
        return Claim(f'r5_{arm.name[4:-3]}', paper, source, f'{name} keeps SAM\'s top-1 gain over AdamW (its top-1 '
                     f'within {R5_MARGIN} pt of SAM\'s)', 'top1', R5_SAM, arm.name, 'unchanged', R5_MARGIN, ' pt')
    return Claim(f'r5_{arm.name[4:-3]}', paper, source, f'{name} raises the ViT\'s top-1 over SAM\'s', 'top1',
                 R5_SAM, arm.name, 'increase', R5_MARGIN, ' pt')


_R5_SOURCES = {
    'vit_esam_x2': ('esam', 'Du et al., ICLR 2022, Tables 1-2'),
    'vit_mesa_x2': ('mesa', 'Du et al., NeurIPS 2022, Tables 1-2'),
    'vit_msam_x2': ('momentum-sam', 'Becker et al., 2024, Table 1'),
    'vit_looksam_x2': ('looksam', 'Liu et al., CVPR 2022, Table 2'),
    'vit_interval_x2': ('interval', 'Composer\'s SAM method card'),
    'vit_gsam_x2': ('gsam', 'Zhuang et al., ICLR 2022, Table 1'),
    'vit_friendlysam_x2': ('friendlysam', 'Li et al., CVPR 2024, Table 1'),
    'vit_samon_x2': ('sam-on', 'Mueller et al., NeurIPS 2023, Table 1'),
    'vit_wsam_x2': ('wsam', 'Yue et al., KDD 2023, Table 2'),
    'vit_asam_x2': ('asam', 'Kwon et al., ICML 2021, Table 1'),
    'vit_gcsam_x2': ('gc-sam', 'GC-SAM, the centralized ascent (docs/sam.md)'),
    'vit_bsam_x2': ('bsam', 'Möllenhoff and Khan, ICLR 2023, Table 1'),
}
R5_CLAIMS: Tuple[Claim, ...] = tuple(_r5_claim(a, *_R5_SOURCES[a.name]) for a in R5_ARMS)


@dataclass(frozen=True)
class RevisionPlan:
    """One revision of the plan as data. ``arms`` train at ``seeds`` (names of arms built elsewhere in this file;
    ``_x<k>`` is an arm at k times its schedule); ``claims`` are read at ``claim_seeds`` where given, else at every
    seed of their arms; ``regroup`` names the groups a rule trains again at twice the schedule where a run of theirs
    misses the convergence rule; ``reused`` the arms read back from earlier revisions; ``seed_rule`` names the rule
    that fixes further seeds from the ones trained first. ``decided`` is the decision, written before its runs."""
    name: str
    decided: str
    arms: Tuple[str, ...] = ()
    seeds: Tuple[int, ...] = ()
    claims: Tuple[str, ...] = ()
    claim_seeds: Mapping[str, int] = field(default_factory=dict)
    regroup: Tuple[Tuple[str, ...], ...] = ()
    reused: Tuple[str, ...] = ()
    seed_rule: str = ''
_DECIDED = {
    '2.1': (
        'Revision 2.1 (2026-11-26, committed before its runs): v2 trained every arm for 30 epochs and 21 of its '
        '80 claim runs missed the convergence rule (8 ViT runs at lr 1e-3 by +0.8 to +1.7 points, 13 of the 20 '
        'runs at lr 3e-3 and 1e-2 by up to +10). The rule stays as it was; the ViT arms get twice the schedule '
        "(``VIT_EPOCHS``, the subsets the same number of steps), the vit-sam paper's own test of convergence "
        'being that a 2x schedule brings no gain (its App. H). The CNN arms met the rule in every run at 30 '
        'epochs and keep it. At lr 1e-2 neither stem came near convergence in v2, so those runs move to the '
        'supporting runs (no verdict); vit_cb_all, read only by the why-paragraphs, too.'
    ),
    '2.2': (
        'Revision 2.2 (2026-11-26, committed before its runs [issue 57: after the seed-0 pilot it cites]): at 60 '
        'epochs every ViT and CNN arm at lr 1e-3 met the rule (55 of 55 runs), but the lr 3e-3 pair did not '
        '(patchify 0 of 5, still gaining 1.4 to 4.7 points in its last 12 epochs; conv stem 3 of 5), and a longer'
        " schedule does not fit the budget. The sweep's second learning rate becomes 2e-3, where a pilot of seed "
        "0 (both stems, 60 epochs, the study's settings) met the rule for both stems; the pilot's top-1 is not "
        'used, the study retrains that seed. The lr 3e-3 runs leave the study, as lr 1e-2 did, to keep it within '
        'its budget.'
    ),
    '2.3': (
        'Revision 2.3 (2026-11-26, committed before its runs): at lr 2e-3, 3 of the 10 runs missed the rule '
        '(patchify seeds 3 and 4 by +4.7 and +3.1 points, still climbing from 75 and 88 % top-1; conv stem seed 1'
        ' by +1.1), and training is deterministic for the ViTs, so rerunning them would miss again. The rule '
        'stays; twice the schedule for the pair (ETA ~150 min) does not fit the budget beside the supporting '
        "runs. The sweep's second learning rate becomes 1.5e-3, half-way between the rate where all 10 runs "
        'converged (1e-3) and 2e-3. No pilot was run at 1.5e-3: the study from a clean cache is the first run of '
        'these arms, and whatever it shows is reported.'
    ),
    '2.4': (
        'Revision 2.4 (2026-11-26, committed before its runs, while the clean run of revision 2.3 was at seed 2):'
        " of the pair's runs finished by then (seeds 0-2), patchify seed 2 at lr 1.5e-3 missed the rule (+0.84 "
        'points; 86.9 % top-1, still climbing as the cosine schedule annealed), the other 5 met it. Whether a '
        'higher rate makes patchify fail or only slows it can only be told by training until the rule holds, so '
        "the sweep's pair now does, seed by seed (``EXTENDED_PAIRS``): where either run of a seed's pair misses "
        'the rule, both stems train that seed again (a fresh cosine schedule, the same settings) for twice the '
        "epochs, up to ``MAX_DOUBLINGS`` times. The claim reads each seed's pair at the shortest schedule where "
        'both runs meet the rule (or the longest tried, named as not converged); the runs it replaces are kept '
        'and listed in the report. Both stems of a seed always share a schedule, so each difference compares '
        'equal budgets. The study from scratch stays within its budget unless more than 2 seeds need 120 epochs '
        '(ETA 134 min plus about 6 min per seed at 120 epochs, 12 more at 240).'
    ),
    '3': (
        'Revision 3 (2026-11-28, issue 39, committed before its runs): more seeds for the claims that more seeds '
        "can settle. At 5 seeds 10 of the 22 claims are inconclusive. ``power.py`` computes, from each claim's 5 "
        'per-seed differences (assumed normal, with the observed mean as the true effect), the seeds at which the'
        ' verdict rule gives a conclusive verdict (anything but "inconclusive") with 80 % probability '
        '(``POWER``), and, as issue 39 counted them, the seeds at which the interval lies beside 0 with 80 % '
        "probability. Within ``REACH`` (20 seeds) by the first count: the ViT's share of active neurons (16 "
        "seeds; 16 beside 0), SAM's top-1 on the ViT (10; 14), SAM's gain larger for the ViT than for the ResNet "
        "(14; 20), the conv stem at lr 1e-3 (9; 9), and less data's NEP (15; 238). Out of reach: SAM's gain with "
        "1/2 and 1/4 of the data (29 and 24), CB's class-token and all-query entropy (123, over 300) and CB's "
        "attention distance (119). The first four get more seeds (``EXTENDED_SEEDS``); less data's NEP, a Hessian"
        ' spectrum read at convergence where the paper reads it at the end of warmup, is left to a later revision'
        " for this one's CPU time (10 more runs of the 1/4-data ViT, about 15 min). Claims on the same arms read "
        "the same seeds: SAM's top-1 on the ViT reads the ViT pair's 16 seeds, 80 % beside 0 from 14, so both "
        'counts are met there; the gain comparison reads 14, the conv stem 9. The new seeds are 5 to N-1, trained'
        ' and measured exactly as seeds 0-4 (the same arms, settings, convergence rule and measurements); seeds '
        '0-4 are not trained again, their runs are read back from docs/reproduction/measurements.json. The '
        'verdict rule and the margins are unchanged.'
        "\n\nAgainst optional stopping: each claim's number of seeds is fixed here, before any new seed is trained, "
        'from the 5-seed data alone, and the claim is read once at exactly that number, whatever its interval '
        'shows on the way and whatever it shows at the end; no claim gets further seeds in this study. The report'
        ' shows the 5-seed verdict and the extended one side by side, and a run that misses the convergence rule '
        'is named, not replaced. The 5-seed effect that fixed N is a noisy estimate, so the real power can be '
        'lower than 80 %: an extended claim can stay inconclusive, and is then reported so.'
    ),
    '3.1': (
        "Revision 3.1 (2026-11-28, issue 39, committed before its runs): 3 of revision 3's 44 runs missed the "
        'convergence rule, each by +0.8 points in its last 12 epochs: vit seed 6, vit_sam seeds 12 and 14. '
        'Revision 3 named them and read them as they were; issue 39 asks that every run meet the rule, which '
        "stays as it is. Revision 2.4's answer carries over: at revision 3's new seeds the ViT arms that the "
        'extended claims compare with each other (``EXTENDED_GROUP``: vit, vit_sam, and vit_convstem at the seeds'
        " the conv stem claim reads, 5-8) form a seed's group, and where any run of a seed's group misses the "
        'rule, every run of that group trains the seed again at twice the schedule (a fresh cosine schedule, the '
        "same settings), up to ``MAX_DOUBLINGS`` times. Every claim reads a seed's group at the shortest schedule"
        ' where all of its runs meet the rule (or the longest tried, named as not converged), so each comparison '
        "between ViT arms compares equal budgets: SAM's top-1 and active share (vit against vit_sam) and the conv"
        " stem (vit against vit_convstem). The gain comparison subtracts the ResNet pair's difference, at its own"
        " 30 epochs (it met the rule at every seed), from the ViT pair's, each difference at equal budgets within"
        " its pair, as at seeds 0-4 where the two pairs' schedules already differ. So this revision trains vit, "
        'vit_sam and vit_convstem at 120 epochs for seed 6, vit and vit_sam for seeds 12 and 14: 7 runs, about 70'
        ' min one core. The runs replaced are kept, and the report shows every extended claim read at 60 epochs '
        'for every seed (revision 3 as first read) beside its reading under this rule. The numbers of seeds, the '
        'verdict rule and the margins do not change, and no claim is read again at other seeds.'
    ),
    '4': (
        'Revision 4 (2026-11-29, issue 47, committed before its runs [issue 57: before 26 of its 32 runs; the '
        "other 6, revision 3.1's pairs at seeds 6, 12 and 14, were trained and published 15 h 44 min before it])."
        ' Three decisions, each fixed before any of its runs [issue 57: of its 26 new runs]: (1) The registered '
        'reading comes first. Revision 3 registered that a run missing the convergence rule is named, not '
        "replaced; revision 3.1 was written after revision 3's verdicts were read and reversed that rule for the "
        'seeds whose runs missed it (seeds 6, 12 and 14: at 60 epochs SAM gains of +1.7, +1.1 and +1.9 points, '
        'the 2nd, the 6th to 8th and the 1st largest of the 16 [issue 57: this said "three of the largest"]). So '
        "each extended claim's primary reading is revision 3's, every run at its first schedule; revision 3.1's "
        "reading stays beside it, labelled as a sensitivity reading decided after revision 3's verdicts. Revision"
        " 2.4's rule was registered before its runs and still governs the lr 1.5e-3 pair [issue 57: revision 2.4 "
        'was written after seed 2 of that pair missed the rule, so by the one standard it is post hoc like '
        "revision 3.1, and its reading stands beside the pair's first one]. (2) The ViT pair at one schedule for "
        'every seed: vit and vit_sam, nothing else changed, at twice ``VIT_EPOCHS`` (120 epochs, a fresh cosine '
        'schedule over the 120; the arms ``longer_schedules.doubled`` names ``vit_x2`` and ``vit_sam_x2``) for '
        "each of ``LONG_SEEDS``, the 16 seeds the headline claim reads, through timm's train.py as before. The "
        "question is whether SAM's gain at 60 epochs is a gain at convergence or a faster convergence: at seeds "
        '12 and 14 the plain ViT met the rule at 60 epochs and still gained over a point at 120. Revision 3.1 '
        'trained seeds 6, 12 and 14 at exactly these settings; those three pairs are reused (``LONG_REUSED``, '
        'read back from measurements.json), the other 13 pairs are trained: 26 runs, about 220 min one core. A '
        'run that misses the convergence rule is named, not replaced, and nothing is trained again at a longer '
        'schedule. The pair is read once at the 16 seeds, by the rule below, as a claim of its own '
        "(``LONG_CLAIM``: SAM raises the ViT's top-1 at 120 epochs), beside the headline, not instead of it. The "
        "paper's App. H check is not registered here. (3) A fifth label, **smaller than claimed**: an interval "
        'entirely on the claimed side of 0 and entirely inside (-margin, +margin) reads "smaller than claimed" '
        '(an effect in the claimed direction, one as large as the margin ruled out), where the rule until now '
        'read it "reproduced", the sign being checked first while the same interval also met "not reproduced". '
        '"Reproduced" now needs the interval on the claimed side of 0 and reaching the margin or beyond; an '
        'interval entirely on the other side of 0 still reads "the opposite" (it rules the claim out as "not '
        'reproduced" does, and more). The label applies to every claim, every revision\'s reading included, and '
        'the report shows the label of the rule before this revision beside it (``SMALLER_THAN_CLAIMED``). The '
        "convergence rule, the margins and every claim's number of seeds are unchanged."
    ),
}
_DECIDED['2'] = ('Revision 2 (2026-11-26, issue 21): the study\'s first plan, every arm of ``ARMS`` (then at 30 '
                 'epochs, the lr sweep at 3e-3 and 1e-2, CB in every block as an arm) for seeds 0-4, every claim of '
                 '``CLAIMS`` read at those 5 seeds. v1 (6 epochs, 3 seeds) was another design; its verdicts are kept '
                 'as a column (``V1_VERDICTS``).')
_DECIDED['5'] = (
    'Revision 5 (2026-12-02, issue 59, committed before its runs): what each SAM buys per unit of compute. Twelve '
    'arms, every SAM-family optimizer timm-ext ships but SAM itself (``R5_ARMS``), on revision 4\'s ViT, data and '
    'settings at its 120 epochs, each at the settings written beside it (its paper\'s for ViTs or the nearest '
    'documented ones, chosen before any run, none tuned on the digits), compared with revision 4\'s runs of SAM '
    '(``vit_sam_x2``) and AdamW (``vit_x2``) at its 16 seeds, reused as they are, paired by seed. One claim per arm '
    '(``R5_CLAIMS``), from its paper, on top-1 against SAM\'s, margin 0.5 pt (between 1 and 2 of the 359 validation '
    'images): the five cheap variants (ESAM, MESA, Momentum-SAM, LookSAM, SAM every 10th step) keep SAM\'s gain, '
    'their top-1 within 0.5 pt of SAM\'s (an "unchanged" claim: reproduced when the interval lies inside (-0.5, '
    '+0.5)); the seven others (GSAM, FriendlySAM, SAM-ON, WSAM, ASAM, GC-SAM, bSAM) raise the top-1 over SAM\'s '
    '(an "increase" claim). The verdict rule is the report\'s.'
    '\n\n'
    'Seeds, in two stages fixed here. Stage 1, the pilot: every arm at seeds 0-2 (``R5_PILOT_SEEDS``: 36 runs). An '
    'arm with a pilot run that fails or ends below 50 % top-1 (``R5_TRAINS``; chance is 10 %) cannot train this '
    'model: it is dropped, its claim not read, its runs kept with why. Stage 2: from the pilot alone, ``power.py`` '
    'fixes each claim\'s number of seeds N, the fewest at which the verdict rule gives a conclusive verdict with 80 % '
    'probability, taking the per-seed differences (arm - SAM) as normal with the claim\'s pilot mean and the '
    'standard deviation pooled over every kept arm\'s pilot differences (one arm\'s 3 seeds estimate its own too '
    'loosely to plan with). N is at least 3 and at most 16 (``R5_REACH``, the reused runs\' seeds); a claim that '
    'needs more is out of reach, with its N. Then, in the order of ``R5_ARMS`` (the cheap variants first), a claim '
    'within reach gets seeds 3 to N-1 if their CPU time, N - 3 times the mean CPU time of the arm\'s pilot runs, fits '
    'in what is left of ``R5_BUDGET_CPU_MIN`` (600 CPU-minutes of new runs, one core each, the pilot\'s own CPU time '
    'taken first); otherwise it is out of reach by the budget, with its N, and the next arm is tried. Each claim is '
    'read once, at exactly its N seeds, whatever it shows on the way; a claim out of reach is not read, and its '
    'pilot is shown as a point with its interval, labelled out of reach. A run that misses the convergence rule is '
    'named, not replaced; a run that fails or is stopped is recorded with why, never dropped, and a claim one of '
    'whose N runs failed is not read.'
    '\n\n'
    'Before the pilot, one check: revision 4\'s AdamW run at seed 0 is trained again on this machine under another '
    'name (``R5_CHECK``); the report says whether its top-1 curve equals the reused run\'s, that is whether the '
    'reused runs are what this machine trains, or the pairs span two machines (same initial weights and data order '
    'either way). Its CPU time counts in the budget; no claim reads it.'
    '\n\n'
    'Cost: each arm\'s train step time over AdamW\'s, measured side by side in one process on the same model, batch '
    'and data (``step_cost.py``: the study\'s ViT, batches of 16 digits, train.py\'s route, the median of interleaved '
    'repeats), beside its forward-backward passes per step; and each run\'s CPU time. The report plots the gain over '
    'AdamW (paired by seed, with its interval) against the cost ratio, every arm a point, the Pareto front marked, '
    'and tabulates gain, the share of SAM\'s gain kept, cost ratio, verdict and converged runs.'
)

R5_SEED_RULE = 'pilot power, pooled sd, budget in order'

PLANS: Tuple[RevisionPlan, ...] = (
    RevisionPlan('2', _DECIDED['2'], tuple(a.name for a in ARMS), SEEDS, tuple(c.key for c in CLAIMS)),
    RevisionPlan('2.1', _DECIDED['2.1'], tuple(a.name for a in ARMS if a.schedule == VIT_EPOCHS), SEEDS),
    RevisionPlan('2.2', _DECIDED['2.2']),
    RevisionPlan('2.3', _DECIDED['2.3'], ('vit_lr1.5e-3', 'vit_convstem_lr1.5e-3'), SEEDS),
    RevisionPlan('2.4', _DECIDED['2.4'], regroup=EXTENDED_PAIRS),
    RevisionPlan('3', _DECIDED['3'], claims=tuple(EXTENDED_SEEDS), claim_seeds=EXTENDED_SEEDS),
    RevisionPlan('3.1', _DECIDED['3.1'], regroup=(EXTENDED_GROUP,)),
    RevisionPlan('4', _DECIDED['4'], ('vit_x2', 'vit_sam_x2'), LONG_SEEDS, (LONG_CLAIM.key,),
                 reused=tuple(f'{a}-s{s}' for a in ('vit_x2', 'vit_sam_x2') for s in LONG_REUSED)),
    RevisionPlan('5', _DECIDED['5'], tuple(a.name for a in R5_ARMS), R5_PILOT_SEEDS, tuple(c.key for c in R5_CLAIMS),
                 reused=tuple(f'{a}-s{s}' for a in (R5_ADAMW, R5_SAM) for s in LONG_SEEDS), seed_rule=R5_SEED_RULE),
)
PLAN_BY_NAME = {p.name: p for p in PLANS}
CLAIM_BY_KEY = {c.key: c for c in (*CLAIMS, LONG_CLAIM, *R5_CLAIMS)}
