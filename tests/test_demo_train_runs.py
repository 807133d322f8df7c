"""timm_ext.demo.train_runs: a train.py run as data, its exact arguments, and its job through the plugin route."""
from pathlib import Path

import pytest
from _timm_train import TRAIN_PY
from conftest import require_timm_script

from timm_ext.demo.train_runs import TrainRun, train_jobs

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ('--num-classes', '10', '--batch-size', '4', '--device', 'cpu', '--seed', '3')


def test_train_args_name_the_run_then_the_shared_settings(tmp_path):
    run = TrainRun('sam-s3', tmp_path / 'data', 'vit_tiny_cb', 'samadamw', 7, SETTINGS, dict(img_size=16, depth=2),
                   dict(rho=0.1))
    assert run.train_args(tmp_path / 'out') == [
        '--data-dir', str(tmp_path / 'data'), '--output', str(tmp_path / 'out'), '--experiment', 'sam-s3',
        '--model', 'vit_tiny_cb', '--epochs', '7', '--opt', 'samadamw', *SETTINGS,
        '--model-kwargs', 'img_size=16', 'depth=2', '--opt-kwargs', 'rho=0.1']
    plain = TrainRun('adamw', tmp_path, 'vit_tiny_patch16_224', 'adamw', 1, model_kwargs=dict(depth=2))
    assert '--opt-kwargs' not in plain.train_args(tmp_path)


def test_a_runs_job_logs_beside_its_folder(tmp_path):
    run = TrainRun('vit', tmp_path / 'data', 'vit_tiny_patch16_224', 'adamw', 5, cost=2.0)
    job = run.job(['python', 'train.py'], tmp_path / 'out')
    assert (job.name, job.log, job.summary, job.epochs, job.cost, job.work) == (
        'vit', tmp_path / 'out' / 'vit.log', tmp_path / 'out' / 'vit' / 'summary.csv', 5, 2.0, 10.0)


def test_train_jobs_check_every_run_against_train_py_before_anything_is_written(tmp_path):
    from PIL import Image

    from timm_ext.launch.build_command import TrainConfigError

    require_timm_script(TRAIN_PY)
    data = tmp_path / 'data'
    for split in ('train', 'validation'):  # the digits' layout, small: 10 classes, an image each
        for cls in range(10):
            (data / split / str(cls)).mkdir(parents=True)
            Image.new('RGB', (16, 16), (cls, cls, cls)).save(data / split / str(cls) / '0.png')
    sized = SETTINGS + ('--input-size', '3', '16', '16')  # the ViT is built for 16 px: the data too, as the demo's
    runs = [TrainRun(name, data, 'vit_tiny_patch16_224', opt, 1, sized, dict(img_size=16, patch_size=4))
            for name, opt in (('a', 'adamw'), ('b', 'samadamw'))]
    jobs = train_jobs(runs, tmp_path / 'out', TRAIN_PY)
    assert [j.name for j in jobs] == ['a', 'b']
    for job, run in zip(jobs, runs):
        assert job.argv[-2:] == ['--device-modules', 'timm_ext'] and str(TRAIN_PY) in job.argv
        assert job.argv[job.argv.index('--opt') + 1] == run.opt
    with pytest.raises(TrainConfigError):
        train_jobs([runs[0], TrainRun('c', data, 'no_such_model', 'adamw', 1, SETTINGS)],
                   tmp_path / 'out', TRAIN_PY)
    assert not (tmp_path / 'out').exists()
    assert train_jobs([], tmp_path / 'out') == []
