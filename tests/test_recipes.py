"""Recipes run in timm's real, unmodified train.py: SAM really runs there, and a run resumes.

train.py is found through TIMM_EXT_TIMM_TRAIN (default: ../shared/timm-train/v1.0.28/train.py
next to the repository). The first run loads a probe module (through the recipe's
``device_modules``) that checks SAM's first update against an independent two-pass computation;
the resumed run uses the recipe with ``device_modules: [timm_ext]`` only.
"""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Tuple

import pytest
import timm
import torch
import yaml
from _cli import train_py_argv
from _sam_settings_cases import BAD, GOOD, case_id, factory_error
from _threads import child_threads
from _timm_train import GIVEN as TIMM_TRAIN_GIVEN
from _timm_train import TRAIN_PY
from conftest import require_timm_script

from timm_ext.optim import SAM_BASES
from timm_ext.recipes import check_recipe

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / 'recipes' / 'examples' / 'sam_minimal.yaml'
_TIMM_VERSION = tuple(int(p) for p in timm.__version__.split('.')[:3] if p.isdigit())
# the default script is timm v1.0.28's: it imports timm.task names that older timm versions lack
TRAIN_PY_TOO_NEW = not TIMM_TRAIN_GIVEN and _TIMM_VERSION < (1, 0, 28)
# train.py logs type(optimizer).__name__: for 'samadamw' the class timm's registry holds (the SAM family's)
CREATED_SAM = 'Created SAMAdamW (samadamw) optimizer'  # timm's registry holds one class per name

# Runs inside train.py: wraps SAM.step on the first call and compares the update with a reference
# built from deep copies of the model and of the base optimizer (fresh gradients at w and at w + e).
# The task's forward is wrapped to note the CPU generator's state at each call: the reference's
# second pass reuses it (the same dropout / drop-path masks, as the paper's JAX code), and a second
# reference that draws new masks shows that the masks matter for this update.
PROBE = '''
import copy, json, os
import torch
from timm.task import ClassificationTask
from timm_ext.optim import SAM

_step = SAM.step
_forward = ClassificationTask.forward
_done = []
_rng_at_call = []


def _forward_noting_rng(self, *args, **kwargs):
    if torch.is_grad_enabled():
        _rng_at_call.append(torch.get_rng_state())
    return _forward(self, *args, **kwargs)


ClassificationTask.forward = _forward_noting_rng


def _flat(ts):
    return torch.cat([t.detach().reshape(-1) for t in ts])


def _expected(model, base, params, grads):
    _, opt, ps = copy.deepcopy((model, base, params))
    for p, g in zip(ps, grads):
        p.grad = g.clone()
    opt.step()
    return _flat(ps)


def _second_pass(self, task, model, params, g1, calls, same_masks):
    norm = _flat(g1).norm()
    m_e, ps_e = copy.deepcopy((model, params))
    with torch.no_grad():
        for p, g, group in zip(ps_e, g1, [g for g in self.param_groups for _ in g['params']]):
            p.add_(group['rho'] * g / norm)
    with torch.random.fork_rng(devices=[]):
        for call, state in zip(calls, _rng_at_call[-len(calls):]):
            if same_masks:
                torch.set_rng_state(state)
            input, target = call.args
            task.criterion(m_e(input), target).backward()
    g2 = [p.grad for p in ps_e]
    if self.settings.clip_grad is not None:  # SAM clips the gradient it applies (global norm)
        g2 = [g * min(1.0, self.settings.clip_grad / (_flat(g2).norm().item() + 1e-6)) for g in g2]
    return g2


def step(self, closure=None, grad_scaler=None, no_sync=None):
    if _done or closure is not None:
        return _step(self, closure, grad_scaler, no_sync)
    _done.append(1)
    replay = self.replay  # train_py_hooks opted SAM in (replay_timm_task)
    task, calls = replay.task, list(replay.calls)
    # timm >= 1.0.24 names the trainable module; timm 1.0.23's task holds it as .model
    model = task.get_trainable_module() if hasattr(task, 'get_trainable_module') else task.model
    params = [p for g in self.param_groups for p in g['params']]
    w0, g1 = _flat(params), [p.grad.clone() for p in params]
    nbt = [b.item() for n, b in model.named_buffers() if n.endswith('num_batches_tracked')]
    sam_ref = _expected(model, self.base_optimizer, params, _second_pass(self, task, model, params, g1, calls, True))
    fresh_ref = _expected(model, self.base_optimizer, params, _second_pass(self, task, model, params, g1, calls, False))
    base_ref = _expected(model, self.base_optimizer, params, g1)
    out = _step(self)
    w1 = _flat(params)
    update = (w1 - w0).norm().item()
    result = dict(
        calls=len(calls), update=update,
        sam_err=(w1 - sam_ref).norm().item() / update,
        fresh_masks_err=(w1 - fresh_ref).norm().item() / update,
        base_err=(w1 - base_ref).norm().item() / update,
        nbt_kept=nbt == [b.item() for n, b in model.named_buffers() if n.endswith('num_batches_tracked')],
        model_known=self.model is model,
    )
    with open(os.environ['SAM_PROBE_OUT'], 'w') as f:
        json.dump(result, f)
    return out


SAM.step = step
'''


def make_image_folder(root: Path, splits: Tuple[Tuple[str, int], ...] = (('train', 4), ('val', 1))) -> None:
    """``root/<split>/class<k>/<i>.png`` for two classes, ``count`` 32 px images each, per ``(split, count)``."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for split, count in splits:
        for cls in range(2):
            folder = root / split / f'class{cls}'
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                pixels[..., cls] = 255  # a learnable signal: class 0 is red, class 1 green
                Image.fromarray(pixels).save(folder / f'{i}.png')


def _run_train(tmp_path: Path, recipe: dict, *args: str) -> subprocess.CompletedProcess:
    recipe_path = tmp_path / f'recipe_{len(list(tmp_path.glob("recipe_*")))}.yaml'
    recipe_path.write_text(yaml.safe_dump(recipe))
    env = dict(os.environ, HF_HUB_OFFLINE='1', SAM_PROBE_OUT=str(tmp_path / 'probe.json'),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO), os.environ.get('PYTHONPATH', '')]),
               OMP_NUM_THREADS=child_threads())
    # --workers 0 as the demo runs train.py: through timm-ext's runner on the releases whose create_loader needs it
    cmd = [sys.executable, *train_py_argv(TRAIN_PY), '-c', str(recipe_path), '--data-dir', str(tmp_path / 'data'),
           '--model', 'test_resnet', '--num-classes', '2', '--img-size', '32', '--batch-size', '4',
           '--device', 'cpu', '--workers', '0', '--warmup-epochs', '0', '--log-interval', '1',
           '--output', str(tmp_path / 'out'), '--checkpoint-hist', '1', *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


SMALL_DATA_CPU = REPO / 'recipes' / 'examples' / 'small_data_cpu.yaml'


@pytest.mark.slow
@pytest.mark.skipif(not TRAIN_PY.is_file(), reason=f'timm train.py not found at {TRAIN_PY} (set TIMM_EXT_TIMM_TRAIN)')
@pytest.mark.skipif(TRAIN_PY_TOO_NEW, reason=f'the default train.py is timm v1.0.28\'s and needs timm >= 1.0.28 '
                    f'(installed {timm.__version__}); set TIMM_EXT_TIMM_TRAIN to the train.py of your timm version')
def test_small_data_cpu_recipe_trains_an_epoch_with_its_lr_ramping_in_the_first_epoch(tmp_path):
    """examples/small_data_cpu as written, through timm-ext's pre-flight checks and the real train.py, on a tiny
    folder in the layout its header gives: the warmup ramps the lr over the first epoch's updates (train.py's
    per-epoch default would train that whole epoch at warmup_lr), and the run validates and writes its summary."""
    from timm_ext.launch.build_command import build_train_command, child_env

    make_image_folder(tmp_path / 'data', (('train', 24), ('validation', 4)))  # 48 images: 3 updates at batch 16
    command = build_train_command(['--data-dir', str(tmp_path / 'data'), '--num-classes', '2', '--epochs', '1',
                                   '--log-interval', '1', '--output', str(tmp_path / 'out'), '--experiment', 'run'],
                                  recipe='examples/small_data_cpu', timm_train=TRAIN_PY)
    env = dict(child_env(), HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1')
    proc = subprocess.run(command.argv, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    recipe = yaml.safe_load(SMALL_DATA_CPU.read_text())
    lrs = [float(line.split('LR: ')[1].split()[0]) for line in log.splitlines() if line.startswith('Train: 0 [')]
    ramp = [recipe['warmup_lr'] + k * (recipe['lr'] - recipe['warmup_lr']) / 3 for k in range(3)]
    assert lrs == pytest.approx(ramp, rel=1e-3), lrs  # 1e-5, 3.4e-4, 6.7e-4: not 1e-5 for the whole epoch
    with open(tmp_path / 'out' / 'run' / 'summary.csv') as f:
        (row,) = list(csv.DictReader(f))
    assert 0 <= float(row['eval_top1']) <= 100 and float(row['train_loss']) > 0, row


def test_example_recipe_names_a_registered_sam():
    recipe = yaml.safe_load(EXAMPLE.read_text())
    assert recipe['device_modules'] == ['timm_ext']
    assert recipe['opt'].startswith('sam') and recipe['opt'][3:] in SAM_BASES
    assert recipe.get('clip_grad') is None and recipe['opt_kwargs']['clip_grad'] == 1.0


@pytest.mark.timm_models_only
def test_example_recipe_has_the_papers_dropout_and_a_batch_independent_lr():
    """Chen et al. 2022 (ViT-SAM): dropout 0.1 in the blocks, lr 3e-3 at batch 4096 (Table 12)."""
    recipe = yaml.safe_load(EXAMPLE.read_text())
    assert recipe.get('drop', 0.0) == 0.0  # timm's --drop is the ViT head's dropout only
    model = timm.create_model(recipe['model'], **recipe['model_kwargs'])
    drop = {name: m.p for name, m in model.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert drop['pos_drop'] == 0.1 and drop['head_drop'] == 0.0
    for idx in range(len(model.blocks)):
        block = f'blocks.{idx}'
        assert drop[f'{block}.attn.proj_drop'] == drop[f'{block}.mlp.drop1'] == drop[f'{block}.mlp.drop2'] == 0.1
        assert drop[f'{block}.attn.attn_drop'] == 0.0
    # no fixed lr: train.py derives it from lr_base; `linear` is explicit (sqrt is its pick for '*ada*' names)
    assert 'lr' not in recipe
    assert (recipe['lr_base'], recipe['lr_base_size'], recipe['lr_base_scale']) == (3e-3, 4096, 'linear')


# --- SAM settings: refused by the recipe check in the optimizer's own words ------------------------------

@pytest.fixture(scope='module')
def parser():
    return require_timm_script(TRAIN_PY)


@pytest.mark.parametrize('case', BAD, ids=case_id)
def test_a_bad_sam_setting_is_the_one_line_create_optimizer_v2_would_raise(parser, case):
    """Each setting of each family, out of range: `timm-ext recipes check` names it before train.py starts, with the
    text create_optimizer_v2 raises for it (train.py would raise it only after building the model and the data)."""
    opt, opt_kwargs = case
    error = factory_error(opt, opt_kwargs)
    assert error is not None, case  # Python refuses it
    assert check_recipe({'device_modules': ['timm_ext'], 'opt': opt, 'opt_kwargs': opt_kwargs}, parser) == [
        f'opt_kwargs: {error} (train.py would stop with this ValueError when it builds the optimizer, after the model '
        f'and the data)']


@pytest.mark.parametrize('case', GOOD, ids=case_id)
def test_good_sam_settings_pass_the_recipe_check(parser, case):
    opt, opt_kwargs = case
    assert factory_error(opt, opt_kwargs) is None
    assert check_recipe({'device_modules': ['timm_ext'], 'opt': opt, 'opt_kwargs': opt_kwargs}, parser) == []


def test_sam_settings_beside_the_other_opt_kwargs_checks(parser):
    """Each check says its own line: an unknown key (by the signature) and a bad value (by the settings' checks)."""
    assert check_recipe({'opt': 'samadamw', 'opt_kwargs': {'rhoo': 0.1, 'rho': -1, 'eta': -1}}, parser) == [
        "opt_kwargs key 'rhoo' is not an argument of the optimizer timm builds for opt 'samadamw' (train.py would "
        "stop with TypeError): did you mean 'rho'?",
        'opt_kwargs: SAM rho must be a finite number >= 0, got rho=-1 (train.py would stop with this ValueError when '
        'it builds the optimizer, after the model and the data)',
        'opt_kwargs: SAM eta must be >= 0, got eta=-1 (train.py would stop with this ValueError when it builds the '
        'optimizer, after the model and the data)']
    assert check_recipe({'opt': 'adamw', 'opt_kwargs': {'rho': -1}}, parser) == [  # not SAM: the signature's line
        "opt_kwargs key 'rho' is not an argument of the optimizer timm builds for opt 'adamw' (train.py would stop "
        "with TypeError): rho is a SAM setting; for SAM write opt: samadamw, else drop rho"]


@pytest.mark.skipif(not TRAIN_PY.is_file(), reason=f'timm train.py not found at {TRAIN_PY} (set TIMM_EXT_TIMM_TRAIN)')
@pytest.mark.skipif(TRAIN_PY_TOO_NEW, reason=f'the default train.py is timm v1.0.28\'s and needs timm >= 1.0.28 '
                    f'(installed {timm.__version__}); set TIMM_EXT_TIMM_TRAIN to the train.py of your timm version')
def test_sam_runs_in_real_train_py_and_resumes(tmp_path):
    """Not slow: every lane runs it, the release lanes with their release's train.py (what their demo proved)."""
    make_image_folder(tmp_path / 'data')
    (tmp_path / 'sam_probe.py').write_text(PROBE)
    recipe = yaml.safe_load(EXAMPLE.read_text())
    recipe['model_kwargs'] = {}  # the ViT's dropout settings; the test model is a tiny ResNet (BatchNorm)
    recipe['opt_kwargs']['rho'] = 0.5

    # two epochs with head dropout and drop-path (random masks in both passes); the probe (loaded after
    # timm_ext) checks the first SAM update
    probed = dict(recipe, device_modules=['timm_ext', 'sam_probe'])
    proc = _run_train(tmp_path, probed, '--epochs', '2', '--experiment', 'run', '--lr', '0.05',
                      '--drop', '0.2', '--drop-path', '0.1')
    log = proc.stdout + proc.stderr
    assert CREATED_SAM in log
    probe = json.loads((tmp_path / 'probe.json').read_text())
    assert probe['calls'] == 1 and probe['nbt_kept'] and probe['model_known']
    # AdamW's first update is ~lr * sign(g): float-level differences in near-zero gradients flip a few
    # elements, hence a relative error of ~1e-3 for the SAM reference against ~1 for plain AdamW
    assert probe['sam_err'] < 1e-2, probe  # the update is the two-pass SAM update with the same masks ...
    assert probe['fresh_masks_err'] > 10 * probe['sam_err'], probe  # ... not with new ones ...
    assert probe['base_err'] > 0.3 and probe['base_err'] > 50 * probe['sam_err'], probe  # ... nor plain AdamW
    run_dir = tmp_path / 'out' / 'run'
    assert (run_dir / 'last.pth.tar').is_file()

    if tuple(int(v) for v in torch.__version__.split('+')[0].split('.')[:2]) < (2, 5):
        pytest.skip(f'the SAM run passed; timm {timm.__version__}\'s --resume cannot load its own checkpoint with '
                    f'torch {torch.__version__} (weights-only unpickling of argparse.Namespace needs torch >= 2.5)')
    # resume from the saved checkpoint with the recipe alone (device_modules: [timm_ext]) for one more
    # epoch, this time with bf16 autocast, gradient accumulation over 2 batches, EMA, and the recipe's lr
    proc = _run_train(tmp_path, recipe, '--epochs', '3', '--experiment', 'resumed',
                      '--resume', str(run_dir / 'last.pth.tar'), '--amp', '--amp-dtype', 'bfloat16',
                      '--grad-accum-steps', '2', '--model-ema')
    log = proc.stdout + proc.stderr
    assert CREATED_SAM in log and 'Restoring optimizer state from checkpoint' in log
    # lr_base 3e-3 at batch 4096, linear: global batch 4 x 1 process x 2 accumulation steps = 8
    assert ('Learning rate (5.859375e-06) calculated from base learning rate (0.003) and effective global '
            'batch size (8) with linear scaling') in log
    with open(tmp_path / 'out' / 'resumed' / 'summary.csv') as f:
        epochs = [int(row['epoch']) for row in csv.DictReader(f)]
    assert epochs == [2]
