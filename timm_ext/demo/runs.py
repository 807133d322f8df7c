"""The demo's runs: timm's plain ViT, the ViT with the conv stem, CB and SAM, and each piece left out.

Every run trains the same ViT shrunk to 16 px digits with the same train.py settings (``TRAIN_ARGS``:
data, epochs, schedule, batch, augmentation, seed); only the model and the optimizer differ. The
settings were chosen on a held-out part of the *training* images, never on the validation images
(``docs/demo.md``, "Why these settings").
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Tuple

from timm_ext.demo.train_runs import TrainRun

__all__ = ['CB', 'DEFAULT_EPOCHS', 'DEMO_RHO', 'IMAGE_SIZE', 'MODEL_KWARGS', 'PIECES', 'QUICK_EPOCHS', 'SAM', 'STEM',
           'TRAIN_ARGS', 'DemoRun', 'demo_runs']

DEFAULT_EPOCHS = 6
QUICK_EPOCHS = 4
DEMO_RHO = 0.05
IMAGE_SIZE = 16
# the ViT, shrunk to 16 px digits (the scans are 8x8): 4x4 patches of 4 px, width 128, 4 blocks of 4 heads
MODEL_KWARGS = dict(img_size=IMAGE_SIZE, patch_size=4, embed_dim=128, depth=4, num_heads=4)
STEM, CB, SAM = 'conv stem', 'CB', 'SAM'
PIECES = (STEM, CB, SAM)

# train.py settings shared by every run; chosen on a held-out part of the training digits (docs/demo.md)
TRAIN_ARGS = (
    '--num-classes', '10', '--input-size', '3', str(IMAGE_SIZE), str(IMAGE_SIZE), '--crop-pct', '1.0',
    '--mean', '0.5', '0.5', '0.5', '--std', '0.5', '0.5', '0.5', '--interpolation', 'bilinear',
    '--train-interpolation', 'bilinear', '--scale', '0.6', '1.0', '--ratio', '0.8', '1.25',
    '--hflip', '0', '--color-jitter', '0', '--smoothing', '0.1',
    '--batch-size', '16', '--validation-batch-size', '128', '--lr', '1e-3', '--weight-decay', '0.05',
    '--sched', 'cosine', '--sched-on-updates', '--warmup-epochs', '1', '--warmup-lr', '1e-5', '--min-lr', '0',
    '--workers', '0', '--log-interval', '1000', '--checkpoint-hist', '1', '--seed', '0', '--device', 'cpu',
)
# relative time of one epoch: SAM takes two forward-backward passes a step, the conv stem about a fifth more
_SAM_COST, _STEM_COST = 2.0, 1.2


@dataclass(frozen=True)
class DemoRun:
    """One train.py run of the demo: its name, its label, its model and optimizer, and the pieces it has."""
    name: str
    label: str
    model: str
    opt: str
    pieces: Tuple[str, ...]
    model_kwargs: Dict[str, Any] = field(default_factory=dict)  # on top of MODEL_KWARGS
    opt_kwargs: Dict[str, Any] = field(default_factory=dict)

    @property
    def cost(self) -> float:
        return (_SAM_COST if SAM in self.pieces else 1.0) * (_STEM_COST if STEM in self.pieces else 1.0)

    def training(self, data_dir: Path, epochs: int) -> TrainRun:
        """This run for the job runner: the shared TRAIN_ARGS and MODEL_KWARGS, then its model and optimizer."""
        return TrainRun(self.name, data_dir, self.model, self.opt, epochs, TRAIN_ARGS,
                        dict(MODEL_KWARGS, **self.model_kwargs), self.opt_kwargs, self.cost)

    def train_args(self, data_dir: Path, output: Path, epochs: int) -> List[str]:
        """train.py's arguments: the shared TRAIN_ARGS and MODEL_KWARGS, then this run's model and optimizer."""
        return self.training(data_dir, epochs).train_args(output)


def demo_runs(quick: bool = False, rho: float = DEMO_RHO) -> List[DemoRun]:
    """The runs the demo compares: the plain ViT, the ViT with all three pieces, and (not quick) each piece off."""
    sam = dict(rho=rho)
    runs = [
        DemoRun('vit', 'ViT + AdamW', 'vit_tiny_patch16_224', 'adamw', ()),
        DemoRun('full', 'ViT + conv stem + CB + SAM', 'vit_tiny_cb', 'samadamw', PIECES, dict(stem='conv'), sam),
    ]
    if not quick:
        runs += [
            DemoRun('no_stem', 'ViT + CB + SAM', 'vit_tiny_cb', 'samadamw', (CB, SAM), opt_kwargs=sam),
            DemoRun('no_cb', 'ViT + conv stem + SAM', 'vit_tiny_convstem', 'samadamw', (STEM, SAM), opt_kwargs=sam),
            DemoRun('no_sam', 'ViT + conv stem + CB', 'vit_tiny_cb', 'adamw', (STEM, CB), dict(stem='conv')),
        ]
    return runs
