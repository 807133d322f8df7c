"""benchmarks/reproduce.py, the reproduction report's wiring: train.py arguments per arm and the verdict rules
(no training here)."""
import importlib.util
import os
from pathlib import Path

import pytest
from conftest import require_timm_script

REPO = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location('reproduce', REPO / 'benchmarks' / 'reproduce.py')
reproduce = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(reproduce)  # an application beside the package, not an importable module of it
ARMS, _ms, _public_argv, _train_args, _verdict, write_report = (
    reproduce.ARMS, reproduce._ms, reproduce._public_argv, reproduce._train_args, reproduce._verdict,
    reproduce.write_report)

_ENV = os.environ.get('TIMM_EXT_TIMM_TRAIN')
_SCRIPTS = Path(_ENV) if _ENV else Path(__file__).resolve().parents[2] / 'shared' / 'timm-train' / 'v1.0.28'
TRAIN_PY = _SCRIPTS if _SCRIPTS.suffix == '.py' else _SCRIPTS / 'train.py'


def test_every_arm_is_a_valid_train_py_command(tmp_path):
    from PIL import Image

    from timm_ext.launch.commands import build_train_command

    require_timm_script(TRAIN_PY)
    for split in ('train', 'validation'):  # the digits' layout, small: 10 classes, 2 images each (batch 16)
        for cls in range(10):
            (tmp_path / 'data' / split / str(cls)).mkdir(parents=True)
            for i in range(2):
                Image.new('RGB', (8, 8)).save(tmp_path / 'data' / split / str(cls) / f'{i}.png')
    for arm in ARMS:
        args = _train_args(arm, tmp_path / 'data', tmp_path / 'runs', seed=2, epochs=3)
        assert args[args.index('--seed') + 1] == '2' and args.count('--seed') == 1
        assert args[args.index('--experiment') + 1] == f'{arm.name}-s2'
        argv = build_train_command(args, timm_train=TRAIN_PY).argv  # checked against train.py's own parser
        assert argv[argv.index('--model') + 1] == arm.model


def test_verdicts_and_spread():
    assert _verdict([-0.1, -0.2, -0.3]).startswith('**reproduced** (3/3')
    assert _verdict([0.1, 0.2, 0.3]).startswith('**not reproduced: the opposite**')
    assert _verdict([-0.1, 0.2, -0.3]) == '**not reproduced: mixed** (2/3 seeds agree)'
    assert _verdict([0.1, 0.2], want_negative=False).startswith('**reproduced**')
    assert _ms([1.0, 2.0, 3.0]) == '2.000 ± 1.000'


def test_report_states_claims_that_do_not_reproduce(tmp_path):
    def vit(entropy):
        return dict(top1=50.0, top1_curve=[30.0, 50.0], train_loss_curve=[2.0, 1.5], entropy=entropy,
                    cls_entropy=entropy, distance=[0.5, 0.5], max_entropy=4.17, cb_layers=[1],
                    lambda_max=10.0, noisy_loss=2.0, train_loss=1.5, activity={'blocks.0.mlp.act': 0.5},
                    tokens={'patch_embed': 0.2}, variance={'patch_embed': 1.0}, fourier_at_pi={'patch_embed': 0.0},
                    kinds={'patch_embed': 'stem'}, variance_ratio={})

    results = {'vit': [vit([4.0, 3.0]), vit([4.0, 3.2])], 'vit_cb': [vit([4.0, 3.5]), vit([4.0, 3.6])]}
    path = write_report(results, [0, 1], 2, tmp_path, 'python benchmarks/reproduce.py', 60.0)
    text = path.read_text()
    assert 'Verdict, all queries: **not reproduced: the opposite** (0/2 seeds)' in text
    assert '| all queries | 3.100 ± 0.141 (3.000, 3.200) | 3.550 ± 0.071 (3.500, 3.600) |' in text
    assert (tmp_path / 'reproduction' / 'cb_entropy.png').stat().st_size > 0
    with pytest.raises(KeyError):
        write_report({'vit': [{}], 'vit_cb': [{}]}, [0], 1, tmp_path, 'cmd', 1.0)


def test_the_printed_command_names_no_path_of_this_machine():
    argv = ['--epochs', '6', '--timm-train', '/home/me/timm/train.py', '--runs=/scratch/runs', '--seeds', '0', '1']
    assert _public_argv(argv) == ['--epochs', '6', '--timm-train', 'PATH', '--runs=DIR', '--seeds', '0', '1']
