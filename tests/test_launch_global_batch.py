"""``--grad-accum-steps auto``: the steps that keep a packaged paper recipe's global batch at any world size.

The arithmetic is tested on its own; the resolution and ``timm-ext train`` against timm's real train.py
parser (TIMM_EXT_TIMM_TRAIN, default ../shared/timm-train/v1.0.28; skipped when absent). Nothing trains.
"""
import os
import shlex
import sys
from pathlib import Path

import pytest
from _cli import run_cli, train_py_argv
from _timm_train import SCRIPTS_DIR, TRAIN_PY
from conftest import require_timm_script

from timm_ext.launch.global_batch import (
    GlobalBatchError,
    accumulation_steps,
    batch_splits,
    resolve_auto_accumulation,
)
from timm_ext.recipes import find_recipe, load_recipe

REPO = Path(__file__).resolve().parents[1]
VIT_SAM = 'vit-sam/imagenet/vit_s16_sam'
CB = 'context-broadcasting/imagenet/vit_small_cb'


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch):
    for name in list(os.environ):
        if name.startswith('SLURM_'):
            monkeypatch.delenv(name)


@pytest.mark.parametrize('global_batch, processes', [(4096, 32), (4096, 1), (1000, 8), (96, 3), (1024, 24), (7, 7)])
def test_batch_splits_are_every_whole_split(global_batch, processes):
    """Against every batch that divides the global batch with the processes: the solver behind auto and behind
    the fixes the checks offer."""
    expected = [(b, global_batch // (b * processes)) for b in range(global_batch, 0, -1)
                if global_batch % (b * processes) == 0]
    assert batch_splits(global_batch, processes) == expected
    assert batch_splits(4096, 32)[:3] == [(128, 1), (64, 2), (32, 4)]


@pytest.mark.parametrize('global_batch, batch, world, steps', [
    (4096, 32, 32, 4), (4096, 128, 32, 1), (4096, 128, 8, 4), (4096, 128, 1, 32), (1024, 128, 1, 8),
    (1024, 64, 16, 1), (4096, 4096, 1, 1),
])
def test_accumulation_steps(global_batch, batch, world, steps):
    assert accumulation_steps(global_batch, batch, world) == steps
    assert batch * world * steps == global_batch


@pytest.mark.parametrize('global_batch, batch, world, message', [
    (4096, 48, 32, '48 per process x 32 processes x whole accumulation steps cannot make 4096: use --batch-size 128, '
                   '64, 32, 16, 8, 4, 2 or 1 (4096 / 32 processes = 128 images per step, batch x accumulation steps)'),
    (4096, 256, 32, '256 per process x 32 processes x whole accumulation steps cannot make 4096: use --batch-size '
                    '128, 64, 32, 16, 8, 4, 2 or 1 (4096 / 32 processes = 128 images per step, batch x accumulation '
                    'steps)'),
    (1000, 64, 8, '64 per process x 8 processes x whole accumulation steps cannot make 1000: use --batch-size 125, '
                  '25, 5 or 1 (1000 / 8 processes = 125 images per step, batch x accumulation steps)'),
    (4096, 32, 24, '32 per process x 24 processes x whole accumulation steps cannot make 4096, nor can any other batch '
                   'on 24 processes (4096 is not a multiple of 24): run on 16 or 32 processes, or give '
                   '--grad-accum-steps N with --allow-batch-change'),
    (4096, 32, 3, '32 per process x 3 processes x whole accumulation steps cannot make 4096, nor can any other batch '
                  'on 3 processes (4096 is not a multiple of 3): run on 2 or 4 processes, or give --grad-accum-steps N '
                  'with --allow-batch-change'),
    (4096, 0, 1, '0 per process x 1 process x whole accumulation steps cannot make 4096: use --batch-size 4096, 2048, '
                 '1024, 512, 256, 128, 64, 32, 16, 8, 4, 2 or 1 (4096 / 1 process = 4096 images per step, batch x '
                 'accumulation steps)'),
])
def test_no_whole_number_of_steps(global_batch, batch, world, message):
    with pytest.raises(GlobalBatchError) as e:
        accumulation_steps(global_batch, batch, world)
    assert str(e.value) == message


# --- against train.py's parser ------------------------------------------------------------------

@pytest.fixture(scope='module')
def parser():
    return require_timm_script(TRAIN_PY)


def _resolve(parser, args, recipe=VIT_SAM, world=32):
    path = find_recipe(recipe) if recipe else None
    return resolve_auto_accumulation(parser, args, path, load_recipe(path) if path else {}, world)


def test_auto_on_four_nodes_of_eight_gpus(parser):
    auto = _resolve(parser, ['--data-dir', 'd', '--grad-accum-steps', 'auto'])
    assert auto.steps == 1 and auto.train_args == ['--data-dir', 'd', '--grad-accum-steps', '1']
    assert auto.line == ('global batch 4096 = 128 per process x 32 processes x 1 accumulation step (--grad-accum-steps '
                         'auto: recipe vit-sam/imagenet/vit_s16_sam, vit-sam Table 2); lr 0.003 unchanged: train.py '
                         'does not rescale an explicit lr')


def test_auto_with_the_command_lines_batch(parser):
    auto = _resolve(parser, ['-b', '32', '--grad-accum-steps=auto'])
    assert auto.steps == 4 and auto.train_args == ['-b', '32', '--grad-accum-steps=4']
    assert auto.line.startswith('global batch 4096 = 32 per process x 32 processes x 4 accumulation steps ')
    assert _resolve(parser, ['--grad-accum-steps', 'auto'], world=8).train_args == ['--grad-accum-steps', '4']


def test_auto_with_the_paper_lr_rule(parser):
    """context-broadcasting's recipes set lr_base at the paper's batch: at that batch train.py's rule keeps it."""
    auto = _resolve(parser, ['--grad-accum-steps', 'auto'], recipe=CB, world=2)
    assert auto.steps == 4 and auto.line == (
        'global batch 1024 = 128 per process x 2 processes x 4 accumulation steps (--grad-accum-steps auto: recipe '
        'context-broadcasting/imagenet/vit_small_cb, context-broadcasting Table 5); train.py scales lr_base 0.001 at '
        '1024 (linear) to lr 0.001')


def test_a_number_passes_through(parser):
    assert _resolve(parser, ['--grad-accum-steps', '3']) is None
    assert _resolve(parser, ['--model', 'auto']) is None  # only the value of --grad-accum-steps


def test_auto_needs_a_paper_recipe(parser, tmp_path):
    with pytest.raises(GlobalBatchError) as e:
        _resolve(parser, ['--grad-accum-steps', 'auto'], recipe=None)
    assert str(e.value) == ("--grad-accum-steps auto keeps a packaged paper recipe's global batch (recipes/index.csv), "
                            "but no recipe: give the number of steps, --grad-accum-steps N")
    mine = tmp_path / 'mine.yaml'
    mine.write_text(find_recipe(VIT_SAM).read_text())
    with pytest.raises(GlobalBatchError) as e:
        resolve_auto_accumulation(parser, ['--grad-accum-steps', 'auto'], mine, load_recipe(mine), 8)
    assert str(e.value) == (f"--grad-accum-steps auto keeps a packaged paper recipe's global batch "
                            f"(recipes/index.csv), but recipe {mine} is not a packaged paper recipe: give the number "
                            f"of steps, --grad-accum-steps N")


def test_auto_refusal_names_the_recipe(parser):
    with pytest.raises(GlobalBatchError) as e:
        _resolve(parser, ['-b', '32', '--grad-accum-steps', 'auto'], world=24)
    assert str(e.value) == (
        '--grad-accum-steps auto: recipe vit-sam/imagenet/vit_s16_sam trains at global batch 4096 (vit-sam Table 2); '
        '32 per process x 24 processes x whole accumulation steps cannot make 4096, nor can any other batch on 24 '
        'processes (4096 is not a multiple of 24): run on 16 or 32 processes, or give --grad-accum-steps N with '
        '--allow-batch-change')


# --- timm-ext train ----------------------------------------------------------------------------------

@pytest.fixture
def timm_scripts(offline_scripts, monkeypatch, parser):
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(SCRIPTS_DIR))


def test_train_prints_the_global_batch_at_start(capsys, timm_scripts):
    code, out, err = run_cli(capsys, 'train', '-c', VIT_SAM, '--nproc-per-node', '8', '--grad-accum-steps', 'auto',
                             '--no-check', '--print-command')
    assert code == 0
    assert shlex.split(out) == [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=8',
                                *train_py_argv(TRAIN_PY), '-c', str(find_recipe(VIT_SAM)), '--grad-accum-steps', '4']
    assert [line for line in err.splitlines() if not line.startswith('timm-ext: note:')] == [
        'timm-ext train: global batch 4096 = 128 per process x 8 processes x 4 accumulation steps (--grad-accum-steps '
        'auto: recipe vit-sam/imagenet/vit_s16_sam, vit-sam Table 2); lr 0.003 unchanged: train.py does not rescale '
        'an explicit lr']


def test_train_refuses_auto_in_one_line(capsys, timm_scripts):
    code, out, err = run_cli(capsys, 'train', '-c', VIT_SAM, '--nproc-per-node', '8', '--nnodes', '3',
                             '--rdzv-endpoint', 'n1:29500', '-b', '32', '--grad-accum-steps', 'auto', '--print-command')
    errors = [line for line in err.splitlines() if not line.startswith('timm-ext: note:')]
    assert code == 2 and out == '' and errors == [
        'timm-ext train: error: --grad-accum-steps auto: recipe vit-sam/imagenet/vit_s16_sam trains at global batch '
        '4096 (vit-sam Table 2); 32 per process x 24 processes x whole accumulation steps cannot make 4096, nor can '
        'any other batch on 24 processes (4096 is not a multiple of 24): run on 16 or 32 processes, or give '
        '--grad-accum-steps N with --allow-batch-change']
    code, _, err = run_cli(capsys, 'train', '--grad-accum-steps', 'auto', '--no-check', '--print-command')
    assert code == 2 and err.splitlines()[-1] == (
        "timm-ext train: error: --grad-accum-steps auto keeps a packaged paper recipe's global batch "
        "(recipes/index.csv), but no recipe: give the number of steps, --grad-accum-steps N")
