"""SAM in the Hugging Face Trainer (timm_ext.integrations.hf_trainer), measured against SAM's closure route.

Each test trains a tiny timm model for a few updates through the Trainer and through a plain ``sam.step(closure)``
loop over the same batches, from the same weights, and compares the weights. Through ``SAMTrainer`` the update
is SAM's own, bit for bit: without accumulation, with ``gradient_accumulation_steps=2`` (against a closure that
back-propagates the window's micro-batches, each loss / 2, as the Trainer does) and with ``max_grad_norm`` (against
SAM's ``clip_grad``). Against one SAM step on the whole window (mean loss over the 8 images) the difference is
float rounding of the two summation orders. A plain ``Trainer`` given a SAM is refused at its first step.
Resuming from the Trainer's checkpoint (``resume_from_checkpoint``) equals the uninterrupted run bit for bit, and
2 processes through the Trainer's own DDP (gloo) equal 1 process on the global batch up to float rounding.
"""
import copy
import logging
import os
import shutil
from types import SimpleNamespace
from typing import List, Optional

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

pytest.importorskip('transformers', reason='the Hugging Face Trainer integration needs transformers')

import timm  # noqa: E402
from _sam_reference import spawn_gloo  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from timm.optim import create_optimizer_v2  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

import timm_ext  # noqa: E402,F401  (registers the models and the SAM optimizers)
from timm_ext.integrations.hf_trainer import SAMTrainer, TimmClassifier, sam_trainer_problem  # noqa: E402

BATCH = 4  # images per micro-batch
IMAGES = 16


def _model(name: str = 'vit', drop: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    if name == 'vit':  # drop: dropout (head, projections) and drop-path at that rate
        return timm.create_model('vit_tiny_cb', img_size=32, patch_size=8, depth=2, num_classes=3, drop_rate=drop,
                                 proj_drop_rate=drop, drop_path_rate=drop)
    return timm.create_model('resnet10t', num_classes=3)  # BatchNorm: SAM keeps the first pass's statistics


def _data():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(IMAGES, 3, 32, 32, generator=g), torch.randint(0, 3, (IMAGES,), generator=g)
    return x, y, [{'pixel_values': x[i], 'labels': y[i]} for i in range(IMAGES)]


def _args(tmp_path, accumulation: int = 1, max_grad_norm: float = 0.0, steps: int = 2, batch: int = BATCH,
          **kwargs) -> TrainingArguments:
    return TrainingArguments(
        str(tmp_path), per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
        max_steps=steps, max_grad_norm=max_grad_norm, lr_scheduler_type='constant',
        train_sampling_strategy='sequential', report_to=[], use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True, logging_steps=1, **{'save_strategy': 'no', **kwargs})


def _closure_reference(model: nn.Module, x, y, opt: str, lr: float, accumulation: int, steps: int,
                       whole_window: bool, clip_grad: Optional[float] = None) -> nn.Module:
    """A plain ``sam.step(closure)`` loop, one SAM update per window of ``accumulation`` micro-batches: on the
    whole window at once (mean loss), or micro-batch by micro-batch (each loss / k, as the Trainer scales it)."""
    model = copy.deepcopy(model)
    sam = create_optimizer_v2(model, opt, lr=lr, rho=0.05, clip_grad=clip_grad)
    model.train()
    per_window = BATCH * accumulation
    for step in range(steps):
        xs, ys = x[step * per_window:(step + 1) * per_window], y[step * per_window:(step + 1) * per_window]

        def closure(xs=xs, ys=ys):
            sam.zero_grad()
            if whole_window:
                loss = F.cross_entropy(model(xs), ys)
                loss.backward()
                return loss
            total = 0.0
            for i in range(accumulation):
                rows = slice(i * BATCH, (i + 1) * BATCH)
                loss = F.cross_entropy(model(xs[rows]), ys[rows]) / accumulation
                loss.backward()
                total = total + loss.detach()
            return total
        sam.step(closure)
    return model


def _sam_trainer(tmp_path, model: nn.Module, opt: str, lr: float, **args) -> SAMTrainer:
    sam = create_optimizer_v2(model, opt, lr=lr, rho=0.05)
    trainer = SAMTrainer(model=TimmClassifier(model), args=_args(tmp_path, **args), train_dataset=_data()[2],
                         optimizers=(sam, None))
    trainer.train()
    return trainer


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    tensors = list(zip(a.parameters(), b.parameters())) + list(zip(a.buffers(), b.buffers()))
    return max((p.detach().double() - q.detach().double()).abs().max().item() for p, q in tensors)


def _moved(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize('name', ['vit', 'resnet10t'])
def test_sam_trainer_equals_closure_loop(tmp_path, name):
    start = _model(name)
    model = copy.deepcopy(start)
    trainer = _sam_trainer(tmp_path, model, 'samadamw', 1e-2)
    x, y, data = _data()
    reference = _closure_reference(start, x, y, 'samadamw', 1e-2, accumulation=1, steps=2, whole_window=True)
    assert _moved(model, start) > 1e-3
    assert _max_diff(model, reference) == 0.0  # measured: 0 (weights and BatchNorm statistics)
    # the wrapper makes evaluation work as for a transformers model: the loss at the trained weights
    model.eval()
    with torch.no_grad():
        expected = F.cross_entropy(model(x), y).item()
    assert trainer.evaluate(data)['eval_loss'] == pytest.approx(expected, rel=1e-5)


def test_sam_trainer_gradient_accumulation(tmp_path):
    start = _model()
    x, y, _ = _data()
    # AdamW: one SAM update per window, exactly (the closure back-propagates the micro-batches as the Trainer does)
    model = copy.deepcopy(start)
    _sam_trainer(tmp_path / 'adamw', model, 'samadamw', 1e-2, accumulation=2)
    reference = _closure_reference(start, x, y, 'samadamw', 1e-2, accumulation=2, steps=2, whole_window=False)
    assert _moved(model, start) > 1e-3
    assert _max_diff(model, reference) == 0.0  # measured: 0
    # SGD: against one SAM step on the whole window (mean loss over its 8 images), float rounding only; AdamW
    # would turn that rounding on near-zero gradient coordinates into lr-sized steps, so it is compared above
    model = copy.deepcopy(start)
    _sam_trainer(tmp_path / 'sgd', model, 'samsgd', 0.1, accumulation=2)
    reference = _closure_reference(start, x, y, 'samsgd', 0.1, accumulation=2, steps=2, whole_window=True)
    assert _moved(model, start) > 0.1
    assert _max_diff(model, reference) < 1e-6  # measured: 1.2e-7


@pytest.mark.parametrize('accumulation', [1, 2])
def test_max_grad_norm_is_sam_clip_grad(tmp_path, accumulation):
    """The Trainer clips after SAMTrainer's replay, i.e. the second-pass gradient: SAM's clip_grad (mode 'norm')."""
    start = _model()
    model = copy.deepcopy(start)
    trainer = _sam_trainer(tmp_path, model, 'samadamw', 1e-2, accumulation=accumulation, max_grad_norm=0.05)
    x, y, _ = _data()
    reference = _closure_reference(start, x, y, 'samadamw', 1e-2, accumulation=accumulation, steps=2,
                                   whole_window=False, clip_grad=0.05)
    norms = [log['grad_norm'] for log in trainer.state.log_history if 'grad_norm' in log]
    assert len(norms) == 2 and min(norms) > 0.05  # the clipping was active at every update
    assert _max_diff(model, reference) == 0.0  # measured: 0 (k = 1 and k = 2)
    unclipped = _closure_reference(start, x, y, 'samadamw', 1e-2, accumulation=accumulation, steps=2,
                                   whole_window=False)
    assert _max_diff(model, unclipped) > 1e-4


class _MaskRecorder(nn.Module):
    """A classifier with dropout that records each forward's dropout mask."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.drop, self.fc2 = nn.Linear(3 * 32 * 32, 16), nn.Dropout(0.5), nn.Linear(16, 3)
        self.masks: List[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.ones(x.shape[0], 16))
        self.masks.append(h != 0)
        return self.fc2(F.relu(self.fc1(x.flatten(1))) * h)


def test_both_passes_draw_the_same_masks(tmp_path):
    """Each micro-batch's replay at w + e draws its first pass's dropout masks, and draws nothing from the run:
    the first passes see the masks a plain AdamW Trainer sees."""
    model = _MaskRecorder()
    sam = create_optimizer_v2(model, 'samadamw', lr=1e-2)
    SAMTrainer(model=TimmClassifier(model), args=_args(tmp_path, accumulation=2), train_dataset=_data()[2],
               optimizers=(sam, None)).train()
    masks = model.masks  # per update: micro-batch 1, 2 at w, then 1, 2 at w + e
    assert len(masks) == 8
    for update in range(2):
        first, second = masks[4 * update:4 * update + 2], masks[4 * update + 2:4 * update + 4]
        assert all(torch.equal(a, b) for a, b in zip(first, second))
        assert not torch.equal(first[0], first[1])
    plain = _MaskRecorder()
    adamw = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    Trainer(model=TimmClassifier(plain), args=_args(tmp_path, accumulation=2), train_dataset=_data()[2],
            optimizers=(adamw, None)).train()
    assert all(torch.equal(a, b) for a, b in zip(plain.masks, masks[0:2] + masks[4:6]))


def _plain_trainer_error(tmp_path) -> str:
    model = _model()
    start = copy.deepcopy(model)
    sam = create_optimizer_v2(model, 'samadamw', lr=1e-2)
    trainer = Trainer(model=TimmClassifier(model), args=_args(tmp_path, accumulation=2), train_dataset=_data()[2],
                      optimizers=(sam, None))
    with pytest.raises(RuntimeError) as err:
        trainer.train()
    assert _max_diff(model, start) == 0.0  # refused before anything moved
    return str(err.value)


def test_plain_trainer_with_sam_is_refused(tmp_path):
    """A plain Trainer calls SAM's step() without a closure: no training task is attached (replay_timm_task), so
    SAM has nothing to replay and refuses in one line."""
    message = _plain_trainer_error(tmp_path)
    assert message.startswith('SAM.step() without a closure can only re-evaluate the loss by replaying a timm '
                              'training task, and none was attached to this optimizer')
    assert 'replay_timm_task' in message
    assert '\n' not in message


def test_plain_trainer_refusal_names_sam_trainer(tmp_path):
    assert 'use timm_ext.integrations.hf_trainer.SAMTrainer in the Hugging Face Trainer' in _plain_trainer_error(
        tmp_path)


def test_sam_trainer_refusals(tmp_path):
    model = _model()
    clipping = create_optimizer_v2(model, 'samadamw', lr=1e-2, clip_grad=1.0)
    with pytest.raises(ValueError, match=r'^SAMTrainer: both max_grad_norm=1.0 .* and SAM\'s clip_grad=1.0 would '
                                         r'clip the second-pass gradient: set max_grad_norm=0'):
        SAMTrainer(model=TimmClassifier(model), args=_args(tmp_path, max_grad_norm=1.0), train_dataset=_data()[2],
                   optimizers=(clipping, None))
    # no SAM given: the Trainer builds its AdamW at train(), refused at the first step
    trainer = SAMTrainer(model=TimmClassifier(model), args=_args(tmp_path), train_dataset=_data()[2])
    with pytest.raises(ValueError, match=r'^SAMTrainer needs a timm-ext SAM optimizer, got AdamW: pass it as '
                                         r'optimizers=\(create_optimizer_v2\(model, \'samadamw\''):
        trainer.train()
    sam = create_optimizer_v2(model, 'samadamw', lr=1e-2)
    fp16 = SimpleNamespace(fp16=True, deepspeed=None, max_grad_norm=0.0)
    assert sam_trainer_problem(fp16, sam).startswith('SAMTrainer does not support fp16')
    chunked = create_optimizer_v2(model, 'samadamw', lr=1e-2, m_sharpness=2)
    assert sam_trainer_problem(SimpleNamespace(fp16=False, deepspeed=None, max_grad_norm=0.0), chunked).startswith(
        'SAMTrainer does not support m_sharpness=2')


def test_bf16(tmp_path):
    """bf16=True on CPU: Accelerate autocasts the model's forward in both passes, as the reference's closure does."""
    start = _model()
    model = copy.deepcopy(start)
    _sam_trainer(tmp_path, model, 'samadamw', 1e-2, accumulation=2, bf16=True)
    x, y, _ = _data()
    reference = copy.deepcopy(start)
    sam = create_optimizer_v2(reference, 'samadamw', lr=1e-2, rho=0.05)
    for step in range(2):
        def closure(step=step):
            sam.zero_grad()
            for i in range(2):
                rows = slice(8 * step + BATCH * i, 8 * step + BATCH * (i + 1))
                with torch.autocast('cpu', dtype=torch.bfloat16):
                    logits = reference(x[rows])
                (F.cross_entropy(logits.float(), y[rows]) / 2).backward()
        sam.step(closure)
    assert _moved(model, start) > 1e-3
    assert _max_diff(model, reference) == 0.0  # measured: 0


# ---- resume from the Trainer's checkpoint --------------------------------------------------------------------

def _resumable_run(out, steps: int, accumulation: int, resume: Optional[str] = None, **sam_settings):
    """vit_tiny_cb with dropout and drop-path (0.1), samadamw with interval=3 (SAM updates 0 and 3: which of the
    updates after a resume are SAM's depends on the restored update count); a checkpoint every 2 updates."""
    model = _model(drop=0.1)
    sam = create_optimizer_v2(model, 'samadamw', lr=1e-2, **{'rho': 0.05, 'interval': 3, **sam_settings})
    trainer = SAMTrainer(model=TimmClassifier(model), train_dataset=_data()[2], optimizers=(sam, None),
                         args=_args(out, accumulation=accumulation, steps=steps, save_strategy='steps', save_steps=2))
    trainer.train(resume_from_checkpoint=resume)
    return model, sam


def _checkpoint_variant(checkpoint, out, drop_rng: bool = False, sam_step: Optional[int] = None) -> str:
    """A copy of ``checkpoint`` without the Trainer's rng_state.pth, or with SAM's update count replaced."""
    shutil.copytree(checkpoint, out)
    if drop_rng:
        os.remove(out / 'rng_state.pth')
    if sam_step is not None:
        state = torch.load(out / 'optimizer.pt', weights_only=True)
        state['sam']['step'] = sam_step
        for group in state['param_groups']:
            group['sam_state']['step'] = sam_step
        torch.save(state, out / 'optimizer.pt')
    return str(out)


@pytest.mark.parametrize('accumulation', [1, 2])
def test_resume_from_checkpoint_equals_uninterrupted(tmp_path, caplog, accumulation):
    """2 updates saving a checkpoint (save_steps=2), then a fresh SAMTrainer resuming from it to 4 updates: the
    weights of 4 uninterrupted updates, bit for bit. The Trainer restores the weights (model.safetensors), SAM
    from optimizer.pt (optimizer.state_dict(): AdamW's moments and SAM's "sam" entry, its update count and
    settings, which win over the fresh SAM's), the LR scheduler, the RNG states (rng_state.pth: the dropout and
    drop-path masks) and the data position (the sequential sampler skips the first 2 updates' batches)."""
    full, full_sam = _resumable_run(tmp_path / 'full', 4, accumulation)
    half, _ = _resumable_run(tmp_path / 'run', 2, accumulation)
    checkpoint = tmp_path / 'run' / 'checkpoint-2'
    assert {'optimizer.pt', 'rng_state.pth', 'scheduler.pt'} <= set(os.listdir(checkpoint))
    assert torch.load(checkpoint / 'optimizer.pt', weights_only=True)['sam'] == dict(
        clip_grad=None, clip_mode='norm', interval=3, m_sharpness=None, use_gc=False, step=2)
    with caplog.at_level(logging.WARNING, logger='timm_ext.optim.sam'):
        resumed, resumed_sam = _resumable_run(tmp_path / 'run', 4, accumulation, resume=str(checkpoint),
                                              rho=0.1, interval=1)  # the checkpoint's settings win
    assert 'SAM settings from the loaded state dict replace this run\'s: rho: 0.1 -> 0.05 in param groups [0]; ' \
           'interval: 1 -> 3' in caplog.text
    assert resumed_sam.state_dict()['sam'] == full_sam.state_dict()['sam'] == dict(
        clip_grad=None, clip_mode='norm', interval=3, m_sharpness=None, use_gc=False, step=4)
    assert resumed_sam.param_groups[0]['rho'] == 0.05
    assert _moved(full, half) > 1e-2  # updates 3 and 4 moved the weights
    assert _max_diff(resumed, full) == 0.0  # measured: 0 (k = 1 and k = 2)
    if accumulation == 1:  # what each restored piece is worth: without it the run differs
        count_lost = _checkpoint_variant(checkpoint, tmp_path / 'count_lost', sam_step=0)
        rng_lost = _checkpoint_variant(checkpoint, tmp_path / 'rng_lost', drop_rng=True)
        for variant in (count_lost, rng_lost):  # update 3 a SAM one instead of 4; other dropout masks
            model, _ = _resumable_run(tmp_path / 'variant', 4, accumulation, resume=variant)
            assert _max_diff(model, full) > 1e-3


# ---- several processes: the Trainer's own DDP (gloo, CPU) ------------------------------------------------------

_DDP_ACCUMULATION = (1, 2)


def _ddp_worker(rank, world_size, port, out_dir):
    """One of 2 processes: per-device batch 2 (global batch 4 as the 1-process run's), samsgd lr 0.1."""
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size), OMP_NUM_THREADS='1')
    torch.set_num_threads(1)
    AcceleratorState._reset_state(True)  # the fork inherits the parent's singletons
    GradientState._reset_state()
    results = {}
    for accumulation in _DDP_ACCUMULATION:
        model = _model()
        sam = create_optimizer_v2(model, 'samsgd', lr=0.1, rho=0.05)
        args = _args(os.path.join(out_dir, f'rank{rank}'), accumulation=accumulation, batch=BATCH // world_size,
                     ddp_backend='gloo')
        trainer = SAMTrainer(model=TimmClassifier(model), args=args, train_dataset=_data()[2], optimizers=(sam, None))
        trainer.train()
        assert args.world_size == world_size
        assert isinstance(trainer.model_wrapped, torch.nn.parallel.DistributedDataParallel)
        results[accumulation] = (model.state_dict(), sam.state_dict()['sam']['step'])
    torch.save(results, os.path.join(out_dir, f'rank{rank}.pt'))


def test_two_processes_equal_one_on_the_global_batch(tmp_path):
    """2 CPU processes (gloo, forked) through the Trainer's own DDP, per-device batch 2, against 1 process with
    batch 4, with and without gradient_accumulation_steps=2. The data order is the same: the sequential sampler
    (train_sampling_strategy='sequential'), and Accelerate hands the per-device batches of 2 out in turn, so the
    2 processes' batches of an accumulation step are the 1-process batch of 4 (images 4i..4i+3). DDP averages the
    2 processes' gradients in the first pass and in SAMTrainer's replay (its last micro-batch synced), so SAM
    perturbs and steps with the global batch's gradient. SGD, not AdamW: AdamW turns the float rounding of the
    two summation orders on near-zero gradient coordinates into lr-sized steps (measured 2.5e-3 and 3.4e-3)."""
    spawn_gloo(_ddp_worker, 2, str(tmp_path))
    ranks = [torch.load(tmp_path / f'rank{rank}.pt', weights_only=True) for rank in range(2)]
    for accumulation in _DDP_ACCUMULATION:
        start = _model()
        model = copy.deepcopy(start)
        _sam_trainer(tmp_path / f'one{accumulation}', model, 'samsgd', 0.1, accumulation=accumulation)
        assert _moved(model, start) > 0.1
        for rank in range(2):
            weights, updates = ranks[rank][accumulation]
            assert updates == 2
            got = copy.deepcopy(start)
            got.load_state_dict(weights)
            assert _max_diff(got, model) <= 1e-5  # measured: 1.9e-7 (k = 1), 1.3e-7 (k = 2)
        assert all(torch.equal(ranks[0][accumulation][0][k], v) for k, v in ranks[1][accumulation][0].items())
