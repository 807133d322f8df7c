"""timm_ext.launch.from_run and ``timm-ext validate --checkpoint RUN``: validate.py gets what train.py evaluated with.

The slow test is the user's route: train with timm's real train.py, then ``timm-ext validate --checkpoint
RUN_FOLDER --data-dir D`` and nothing else, which must print train.py's last top-1.
"""
import argparse
import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
import torch
from _cli import run_cli
from _threads import child_threads
from _timm_train import SCRIPTS_DIR, VALIDATE_PY
from conftest import require_timm_script

from timm_ext.launch.from_run import RunError, RunSettings, run_checkpoint, validate_args_from_run

REPO = Path(__file__).resolve().parents[1]

TRAIN_ARGS = {
    'model': 'vit_tiny_cb', 'model_kwargs': {'img_size': 16, 'patch_size': 4, 'embed_dim': 32, 'depth': 2,
                                             'num_heads': 2, 'stem': 'conv'},
    'num_classes': 10, 'input_size': [3, 16, 16], 'img_size': None, 'crop_pct': 1.0, 'crop_mode': None,
    'interpolation': 'bilinear', 'mean': [0.5, 0.5, 0.5], 'std': [0.5, 0.5, 0.5], 'amp': False,
    'amp_dtype': 'float16', 'device': 'cpu', 'data_dir': '/data/digits', 'dataset': '', 'val_split': 'validation',
    'class_map': '', 'model_ema': False, 'gp': None, 'in_chans': None,
}


@pytest.fixture
def validate_parser():
    return require_timm_script(VALIDATE_PY)


def _run(**changes) -> RunSettings:
    return RunSettings(Path('/runs/full/last.pth.tar'), 'vit_tiny_cb', dict(TRAIN_ARGS, **changes), 'last.pth.tar')


def test_the_run_fills_what_the_user_left_out(validate_parser):
    result = validate_args_from_run(validate_parser, ['--checkpoint', 'c.pth.tar'], _run())
    parsed = validate_parser.parse_args(result.args)
    assert parsed.model == 'vit_tiny_cb' and parsed.model_kwargs == TRAIN_ARGS['model_kwargs']
    assert (parsed.num_classes, parsed.input_size, parsed.crop_pct, parsed.interpolation) == (10, [3, 16, 16], 1.0,
                                                                                              'bilinear')
    assert (parsed.mean, parsed.std, parsed.device, parsed.data_dir) == ([0.5] * 3, [0.5] * 3, 'cpu', '/data/digits')
    assert parsed.use_train_size and not parsed.use_ema and not parsed.amp
    assert result.taken == [
        'from full/last.pth.tar: --model vit_tiny_cb, --model-kwargs img_size=16 patch_size=4 embed_dim=32 depth=2 '
        'num_heads=2 stem=conv, --num-classes 10, --input-size 3 16 16, --crop-pct 1.0, --interpolation bilinear, '
        '--mean 0.5 0.5 0.5, --std 0.5 0.5 0.5, --device cpu, --data-dir /data/digits, --use-train-size']
    assert result.overrides == []


def test_the_users_flags_win_and_those_that_change_the_result_are_named(validate_parser):
    argv = ['--checkpoint', 'c.pth.tar', '--mean', '0.485', '0.456', '0.406', '--device', 'cuda', '--data-dir', 'D']
    result = validate_args_from_run(validate_parser, argv, _run())
    parsed = validate_parser.parse_args(result.args)
    assert parsed.mean == [0.485, 0.456, 0.406] and parsed.device == 'cuda' and parsed.data_dir == 'D'
    assert result.overrides == ['--mean 0.485 0.456 0.406 differs from the run\'s 0.5 0.5 0.5: the top-1 will not be '
                                'the one train.py printed']  # the device and the data folder change no result


def test_amp_and_ema_follow_train_py(validate_parser):
    run = RunSettings(Path('/r/last.pth.tar'), 'vit_tiny_cb', dict(TRAIN_ARGS, amp=True, amp_dtype='bfloat16',
                                                                   model_ema=True), 'last.pth.tar', has_ema=True)
    parsed = validate_parser.parse_args(validate_args_from_run(validate_parser, [], run).args)
    assert parsed.amp and parsed.amp_dtype == 'bfloat16' and parsed.use_ema  # train.py's top-1 is the EMA's
    forced_cpu = RunSettings(run.checkpoint, run.arch, dict(run.args, model_ema_force_cpu=True), run.source,
                             has_ema=True)
    assert not validate_parser.parse_args(validate_args_from_run(validate_parser, [], forced_cpu).args).use_ema


def test_run_folder_picks_last_or_best(tmp_path):
    (tmp_path / 'last.pth.tar').write_bytes(b'x')
    assert run_checkpoint(tmp_path) == tmp_path / 'last.pth.tar'
    with pytest.raises(RunError, match=r'has no model_best.pth.tar \(it has last.pth.tar\): give a checkpoint file'):
        run_checkpoint(tmp_path, best=True)
    with pytest.raises(RunError, match=r'--best picks model_best.pth.tar in a run folder, and .* is a file'):
        run_checkpoint(tmp_path / 'last.pth.tar', best=True)


def _folder(tmp_path: Path) -> Path:
    """An ImageFolder with the validation split validate.py reads: the run's 10 classes, one image each."""
    from PIL import Image
    for k in range(10):
        (tmp_path / 'data' / 'validation' / f'c{k}').mkdir(parents=True)
        Image.new('RGB', (16, 16)).save(tmp_path / 'data' / 'validation' / f'c{k}' / '0.png')
    return tmp_path / 'data'


def _saved_run(folder: Path, names=('last.pth.tar',), args: bool = True) -> Path:
    """A run folder as train.py leaves it (``names``: its checkpoints, each with train.py's namespace under ``args``
    unless not ``args``: a bare state_dict), but without its args.yaml."""
    import timm
    model = timm.create_model('vit_tiny_cb', num_classes=10, **TRAIN_ARGS['model_kwargs'])
    folder.mkdir(parents=True)
    for name in names:
        saved = {'state_dict': model.state_dict()}
        if args:
            saved.update(arch='vit_tiny_cb', epoch=1, args=argparse.Namespace(**TRAIN_ARGS))
        torch.save(saved, folder / name)
    return folder


def test_a_run_folder_without_args_yaml_is_read_from_its_checkpoint(tmp_path, capsys, validate_parser):
    """args.yaml gone: the checkpoint's own arguments (train.py's namespace, read weights-only) give the model and
    the preprocessing, never validate.py's default dpn92; with several checkpoints, a note names the one used."""
    common = ['validate', '--timm-validate', str(VALIDATE_PY), '--dry-run', '--data-dir', str(_folder(tmp_path))]
    one = _saved_run(tmp_path / 'one')
    code, out, err = run_cli(capsys, *common, '--checkpoint', one)
    assert code == 0 and f'--checkpoint {one / "last.pth.tar"} --model vit_tiny_cb --model-kwargs img_size=16' in out
    assert [line for line in err.splitlines() if 'note: from' in line] == [
        'timm-ext validate: note: from one/last.pth.tar: --model vit_tiny_cb, --model-kwargs img_size=16 patch_size=4 '
        'embed_dim=32 depth=2 num_heads=2 stem=conv, --num-classes 10, --input-size 3 16 16, --crop-pct 1.0, '
        '--interpolation bilinear, --mean 0.5 0.5 0.5, --std 0.5 0.5 0.5, --device cpu, --use-train-size']
    several = _saved_run(tmp_path / 'several', ('checkpoint-0.pth.tar', 'last.pth.tar', 'model_best.pth.tar'))
    code, out, err = run_cli(capsys, *common, '--checkpoint', several)
    assert code == 0 and f'--checkpoint {several / "last.pth.tar"} --model vit_tiny_cb' in out
    assert f'timm-ext validate: note: {several} has no args.yaml: validating last.pth.tar with the arguments ' \
           f'train.py saved in it (the folder holds checkpoint-0.pth.tar, last.pth.tar, model_best.pth.tar; --best ' \
           f'takes model_best.pth.tar, --checkpoint FILE another)' in err.splitlines()
    code, out, err = run_cli(capsys, *common, '--checkpoint', several, '--best')
    assert code == 0 and f'--checkpoint {several / "model_best.pth.tar"} --model vit_tiny_cb' in out
    assert f'timm-ext validate: note: {several} has no args.yaml: validating model_best.pth.tar with the arguments ' \
           f'train.py saved in it (the folder holds checkpoint-0.pth.tar, last.pth.tar, model_best.pth.tar; ' \
           f'--checkpoint FILE another)' in err.splitlines()
    # a folder of checkpoints with --model: validate.py's own reading, each file with that model
    code, out, _ = run_cli(capsys, *common, '--checkpoint', several, '--model', 'vit_tiny_cb', '--device', 'cpu')
    assert code == 0 and out.split()[-6:] == ['--checkpoint', str(several), '--model', 'vit_tiny_cb', '--device', 'cpu']


def test_a_folder_validate_py_would_read_with_its_default_model_is_one_line(tmp_path, capsys, validate_parser):
    common = ['validate', '--timm-validate', str(VALIDATE_PY), '--dry-run', '--data-dir', str(_folder(tmp_path)),
              '--checkpoint']
    bare = _saved_run(tmp_path / 'bare', ('last.pth.tar', 'model_best.pth.tar'), args=False)
    code, out, err = run_cli(capsys, *common, bare)
    assert code == 2 and out == '' and err.splitlines()[-1] == (
        f'timm-ext validate: error: {bare / "last.pth.tar"} holds no train.py arguments and {bare} has no args.yaml, '
        f'so its model is unknown (validate.py would validate every file there with its default dpn92): give one of '
        f'its checkpoints (last.pth.tar, model_best.pth.tar) and its model: --checkpoint {bare / "last.pth.tar"} '
        f'--model NAME')
    code, out, _ = run_cli(capsys, *common, bare / 'last.pth.tar', '--model', 'vit_tiny_cb', '--model-kwargs',
                           *[f'{k}={v}' for k, v in TRAIN_ARGS['model_kwargs'].items()], '--num-classes', '10',
                           '--device', 'cpu')
    assert code == 0 and f'--checkpoint {bare / "last.pth.tar"}' in out and '--model vit_tiny_cb' in out  # the fix
    (tmp_path / 'empty').mkdir()
    code, out, err = run_cli(capsys, *common, tmp_path / 'empty')
    assert code == 2 and out == '' and err.splitlines()[-1] == (
        f'timm-ext validate: error: --checkpoint {tmp_path / "empty"} holds no checkpoint (*.pth.tar, *.pth) and no '
        f'args.yaml: give the folder train.py wrote (OUTPUT/train/RUN) or a checkpoint file')
    kept = _saved_run(tmp_path / 'kept', ('checkpoint-3.pth.tar', 'checkpoint-4.pth.tar'))
    code, out, err = run_cli(capsys, *common, kept)
    assert code == 2 and out == '' and err.splitlines()[-1] == (
        f'timm-ext validate: error: --checkpoint {kept} holds 2 checkpoints (checkpoint-3.pth.tar, '
        f'checkpoint-4.pth.tar) and no args.yaml or last.pth.tar: give one, e.g. --checkpoint '
        f'{kept / "checkpoint-4.pth.tar"} (with --model NAME if it holds no train.py arguments), or --model NAME to '
        f'validate each')
    assert sorted(p.name for p in kept.iterdir()) == ['checkpoint-3.pth.tar', 'checkpoint-4.pth.tar']  # untouched


def _digits(tmp_path: Path) -> Path:
    pytest.importorskip('sklearn', reason='the digits data needs scikit-learn (pip install "timm-ext[demo]")')
    from timm_ext.data import digits_image_folder
    return digits_image_folder(tmp_path / 'digits', size=16)


def _train(capfd, tmp_path: Path, data: Path) -> Path:
    kwargs = [f'{k}={v}' for k, v in TRAIN_ARGS['model_kwargs'].items()]
    code, _, err = run_cli(
        capfd, 'train', '--timm-train', SCRIPTS_DIR / 'train.py', '--data-dir', data, '--model', 'vit_tiny_cb',
        '--model-kwargs', *kwargs, '--num-classes', '10', '--input-size', '3', '16', '16', '--crop-pct', '1.0',
        '--mean', '0.5', '0.5', '0.5', '--std', '0.5', '0.5', '0.5', '--interpolation', 'bilinear',
        '--train-interpolation', 'bilinear', '--hflip', '0', '--opt', 'adamw', '--lr', '2e-3', '--epochs', '2',
        '--warmup-epochs', '0', '-b', '32', '--model-ema', '--model-ema-decay', '0.9', '--device', 'cpu',
        '--workers', '0', '--output', tmp_path / 'out', '--experiment', 'run', '--log-interval', '1000')
    assert code == 0, err[-3000:]
    return tmp_path / 'out' / 'run'


@dataclass
class Validated:
    code: int
    stderr: str  # timm-ext's and validate.py's
    result: Optional[dict]  # validate.py's --results-file


def _validate(capfd, tmp_path: Path, *args: str) -> Validated:
    results = tmp_path / f'results{len(list(tmp_path.glob("results*")))}.json'
    code, _, err = run_cli(capfd, 'validate', '--timm-validate', VALIDATE_PY, *args, '--results-file', results,
                           '--results-format', 'json')
    return Validated(code, err, json.loads(results.read_text()) if results.is_file() else None)


@pytest.mark.slow
def test_validate_on_the_run_folder_prints_train_pys_top1(tmp_path, capfd, monkeypatch, validate_parser):
    """``timm-ext train`` and ``timm-ext validate`` run in this process (pytest's capfd holds their output and their
    children's), timm's train.py and validate.py as their children, as a user's command line starts them."""
    monkeypatch.setenv('OMP_NUM_THREADS', child_threads())  # the children's
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    if tuple(int(v) for v in torch.__version__.split('+')[0].split('.')[:2]) < (2, 5):
        pytest.skip(f'validate.py cannot load train.py\'s checkpoint with torch {torch.__version__} (weights-only '
                    f'unpickling of argparse.Namespace needs torch >= 2.5)')
    data = _digits(tmp_path)
    run = _train(capfd, tmp_path, data)
    with open(run / 'summary.csv') as f:
        rows = list(csv.DictReader(f))
    last, best = float(rows[-1]['eval_top1']), max(float(r['eval_top1']) for r in rows)

    proc = _validate(capfd, tmp_path, '--checkpoint', str(run), '--data-dir', str(data))
    assert proc.code == 0, proc.stderr[-3000:]
    assert abs(proc.result['top1'] - last) < 0.1, (proc.result, rows)
    note = [line for line in proc.stderr.splitlines() if line.startswith('timm-ext validate: note: from run/')]
    assert len(note) == 1 and '--mean 0.5 0.5 0.5' in note[0] and '--use-ema' in note[0], proc.stderr

    # --best, and args.yaml gone (the arguments train.py saved in the checkpoint read instead; validate.py alone would
    # validate every file of the folder with its default dpn92 and exit 0): the command validated above but for the
    # checkpoint file, and the same command, so the same top-1s (the best one's: model_best.pth.tar)
    def command(*args):
        code, out, err = run_cli(capfd, 'validate', '--timm-validate', str(VALIDATE_PY), '--checkpoint', str(run),
                                 *args, '--data-dir', str(data), '--dry-run')
        assert code == 0, err
        return out.strip().splitlines()[-1]

    assert f'--checkpoint {run / "last.pth.tar"} ' in command()
    assert command('--best') == command().replace(str(run / 'last.pth.tar'), str(run / 'model_best.pth.tar'))
    with_args_yaml = command()
    (run / 'args.yaml').rename(tmp_path / 'args.yaml')
    assert command() == with_args_yaml
    (tmp_path / 'args.yaml').rename(run / 'args.yaml')
    assert best >= last and (run / 'model_best.pth.tar').is_file()

    # what the route replaces: validate.py's own preprocessing and weights (the model, no EMA, ImageNet's
    # mean/std, its default crop) give another top-1
    kwargs = [f'{k}={v}' for k, v in TRAIN_ARGS['model_kwargs'].items()]
    proc = _validate(capfd, tmp_path, '--no-run-args', '--checkpoint', str(run / 'last.pth.tar'), '--data-dir',
                     str(data), '--model', 'vit_tiny_cb', '--model-kwargs', *kwargs, '--num-classes', '10',
                     '--img-size', '16', '--device', 'cpu')
    assert proc.code == 0, proc.stderr[-3000:]
    assert abs(proc.result['top1'] - last) > 1.0, (proc.result, rows)


def test_a_class_count_that_does_not_fit_is_one_line(tmp_path, capsys, validate_parser):
    import timm
    model = timm.create_model('vit_tiny_cb', num_classes=10, **TRAIN_ARGS['model_kwargs'])
    run = tmp_path / 'run'
    run.mkdir()
    torch.save({'state_dict': model.state_dict(), 'arch': 'vit_tiny_cb',
                'args': argparse.Namespace(**TRAIN_ARGS)}, run / 'last.pth.tar')
    (run / 'args.yaml').write_text('model: vit_tiny_cb\n')
    common = ['validate', '--timm-validate', str(VALIDATE_PY), '--checkpoint', str(run), '--dry-run',
              '--data-dir', str(_digits(tmp_path))]
    code, _, err = run_cli(capsys, *common, '--num-classes', '5')
    assert code == 2 and err.splitlines()[-1] == (
        f'timm-ext validate: error: --num-classes 5 does not fit {run / "last.pth.tar"}: head.weight is (10, 32) '
        f'there, (5, 32) in the model: the run has 10 classes (drop --num-classes)')
    code, out, err = run_cli(capsys, *common)
    assert code == 0 and f'--checkpoint {run / "last.pth.tar"} --model vit_tiny_cb' in out
    code, _, err = run_cli(capsys, *common, '--model', 'resnet18')
    assert code == 2 and err.splitlines()[-1].endswith(
        'got an unexpected keyword argument \'img_size\' (the run trained vit_tiny_cb: drop --model, or add '
        '--no-run-args to take nothing from the run)')
    code, _, err = run_cli(capsys, 'validate', '--timm-validate', str(VALIDATE_PY), '--best', '--dry-run')
    assert code == 2 and err.splitlines()[-1] == ('timm-ext validate: error: --best picks model_best.pth.tar of the '
                                                  'run folder given with --checkpoint: add it')
