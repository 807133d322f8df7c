"""Supporting runs of the reproduction study: the evidence that explains failed claims and tests convergence.

They are not claims and have no verdicts; ``why_failed`` reads them. Three kinds, all for every seed:

* the 30-epoch schedule (cosine to zero) of the ViT with and without CB and of the conv-stem ViT, v2's
  claim arms under another name: the vit-sam paper's test of convergence (does doubling the schedule
  to the study's 60 epochs gain top-1?) and the attention entropy and token similarity against
  training length;
* the ViT with CB in every block at 30 epochs, v2's dose-response arm (entropy against CB depth,
  compared with the 30-epoch ViT and ViT + CB);
* the checkpoint at the end of warmup (1 epoch) of the ViT, the pre-act ResNet, AlterNet and the ViT
  on 1/4 of the data: how-do-vits-work reads its Hessian spectra there ("warmup^th", official README
  figure). With ``--epochs 1`` train.py's warmup is the same update by update as in the full run, so
  this first epoch is the first epoch of the full run (the report checks that their top-1 agree).

v2 also ran 6- and 15-epoch schedules and, after revision 2.1's plan moved them here, the two stems at
lr 1e-2 (30 epochs; neither came near convergence). They are no longer run: with the ViTs at 60 epochs
they would take the study from scratch past its 2.5-hour budget (ETA 148 min on an idle 2-core
machine with them, 134 without). Revision 2.1's lr 3e-3 pair (60 epochs; patchify never converged)
left with revision 2.2 for the same reason.
"""
from dataclasses import dataclass
from typing import Dict, Tuple

from longer_schedules import EXTENSION_ARMS
from plan import ARMS, CNN, CNN_ALL, CURVE, EPOCHS, R5_ARMS, R5_CHECK, VIT, VIT_ALL, VIT_SAM, Arm

# the training-length runs need the attention and token measurements only, not the Hessian ones
ATTENTION = 'attention'


@dataclass(frozen=True)
class ScheduleArm(Arm):
    """An arm with its own number of epochs (a whole schedule, warmup included)."""
    total_epochs: int = EPOCHS

    @property
    def epochs(self) -> int:
        return self.total_epochs

    @property
    def cost(self) -> float:
        per_epoch = {'vit_tiny_convstem': 1.2, 'alternet_18_nomsa_cifar': 0.75, 'alternet_18_cifar': 0.8}.get(
            self.model, 1.0)
        measure = 0.05 if self.measure in (ATTENTION, CURVE) else 0.35
        return per_epoch * self.total_epochs * self.fraction / EPOCHS + measure  # an epoch of 1/4 data: 1/4 the time


SUPPORT_ARMS: Tuple[ScheduleArm, ...] = (
    ScheduleArm('vit_e30', 'ViT + AdamW, 30 epochs', 'vit_tiny_patch16_224', VIT, total_epochs=30, measure=ATTENTION),
    ScheduleArm('vit_cb_e30', 'ViT + CB, 30 epochs', 'vit_tiny_cb', VIT, total_epochs=30, measure=ATTENTION),
    ScheduleArm('vit_convstem_e30', 'ViT conv stem, 30 epochs', 'vit_tiny_convstem', VIT, total_epochs=30,
                measure=ATTENTION),
    ScheduleArm('vit_cb_all', 'ViT + CB (every block), 30 epochs', 'vit_tiny_cb_all', VIT, total_epochs=30,
                measure=VIT_ALL),
    ScheduleArm('vit_warmup', 'ViT + AdamW, end of warmup', 'vit_tiny_patch16_224', VIT, total_epochs=1,
                measure=VIT_SAM),
    ScheduleArm('resnet_warmup', 'pre-act ResNet-18/4, end of warmup', 'alternet_18_nomsa_cifar', CNN,
                total_epochs=1, measure=CNN_ALL),
    ScheduleArm('alternet_warmup', 'AlterNet-18/4, end of warmup', 'alternet_18_cifar', CNN, total_epochs=1,
                measure=CNN_ALL),
    ScheduleArm('vit_quarter_warmup', 'ViT + AdamW, 1/4 data, end of warmup', 'vit_tiny_patch16_224', VIT,
                fraction=0.25, total_epochs=1, measure=VIT_SAM),
)
# the full run whose first epoch each end-of-warmup run repeats
WARMUP_OF = {'vit_warmup': 'vit', 'resnet_warmup': 'resnet', 'alternet_warmup': 'alternet',
             'vit_quarter_warmup': 'vit_quarter'}
ALL_ARMS: Tuple[Arm, ...] = ARMS + SUPPORT_ARMS
# every arm a run can belong to: the plan's, revision 2.4's longer schedules of the lr sweep's pair, revision 5's
ALL_ARMS_BY_NAME: Dict[str, Arm] = {a.name: a for a in ALL_ARMS + EXTENSION_ARMS + R5_ARMS + (R5_CHECK[0],)}
