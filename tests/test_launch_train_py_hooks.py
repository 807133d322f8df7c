"""timm_ext.launch.train_py_hooks: an interrupted train.py run, resumed with the command timm-ext prints, is the
uninterrupted run (the same weights bit for bit, one summary.csv with one header)."""
import csv
import io
import os
import random
import shlex
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from _cli import run_cli
from _timm_train import TRAIN_PY

from timm_ext.launch import train_py_hooks
from timm_ext.launch.train_py_hooks import is_train_py, random_state, set_random_state

REPO = Path(__file__).resolve().parents[1]


def _draws():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_random_state_survives_a_weights_only_checkpoint():
    buffer = io.BytesIO()
    torch.save({'optimizer': {'state': {}, train_py_hooks.RNG_KEY: random_state()}}, buffer)
    expected = _draws()
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)  # as train.py's resume and timm-ext's readers load it
    _draws()
    set_random_state(loaded['optimizer'][train_py_hooks.RNG_KEY])
    assert _draws() == expected


def test_only_timms_train_py_is_hooked():
    assert not is_train_py(sys.modules['__main__']) and not is_train_py(None)
    train = types.ModuleType('train')
    train.__file__ = '/somewhere/train.py'
    assert not is_train_py(train)  # a train.py without train.py's functions
    train.main = train.train_one_epoch = lambda: None
    assert is_train_py(train)


# A script standing for timm's train.py: main and train_one_epoch defined, timm_ext imported inside main() (as
# train.py's --device-modules timm_ext does); it builds a SAM through timm's factory and prints what it got.
_FAKE_TRAIN_PY = """
import sys


def train_one_epoch():
    pass


def main():
    import timm_ext  # noqa: F401  (train_py_hooks are installed when __main__ is timm's train.py)
    import torch
    from timm.optim import create_optimizer_v2
    from timm.task import TrainingTask
    from timm_ext.optim.task_recorder import RecorderState

    task_call = TrainingTask.__call__
    model = torch.nn.Linear(4, 2)
    sam = create_optimizer_v2(model, 'samadamw', lr=1e-3)
    replay = sam.replay
    state = replay.state is RecorderState.WAITING if replay is not None else None
    print(replay is not None, state, TrainingTask.__call__ is not task_call)


if __name__ == '__main__':
    main()
"""


@pytest.mark.parametrize('script, expected', [
    ('train.py', 'True True True'),  # opted in: replay_timm_task(sam) waits for train.py's task
    ('my_loop.py', 'False None False'),  # elsewhere nothing is opted in: sam.replay stays None
])
def test_sam_from_the_factory_replays_the_task_only_in_train_py(tmp_path, script, expected):
    path = tmp_path / script
    path.write_text(_FAKE_TRAIN_PY)
    env = dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get('PYTHONPATH', '')]))
    done = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == expected


def test_summary_is_continued_not_given_a_second_header(tmp_path):
    from timm.utils.summary import update_summary

    update = train_py_hooks.continuing_summary(update_summary)
    path = str(tmp_path / 'summary.csv')
    update(0, {'loss': 1.0}, {'top1': 50.0}, path, lr=0.1, write_header=True)
    update(1, {'loss': 0.5}, {'top1': 60.0}, path, lr=0.1, write_header=True)  # train.py after a resume
    with open(path) as f:
        assert f.read().splitlines() == ['epoch,train_loss,eval_top1,lr', '0,1.0,50.0,0.1', '1,0.5,60.0,0.1']
    other = str(tmp_path / 'other.csv')
    update(0, {'loss': 1.0}, None, other, lr=None, write_header=True)
    with open(other) as f:
        assert f.read().splitlines() == ['epoch,train_loss', '0,1.0']


@pytest.mark.slow
@pytest.mark.skipif(not TRAIN_PY.is_file(), reason=f'timm\'s train.py not found at {TRAIN_PY} (set '
                                                   f'TIMM_EXT_TIMM_TRAIN)')
# SAM only: the resume command timm-ext prints does not depend on the optimizer, and SAM's run also carries the
# state that only SAM adds (a plain AdamW run was the second case here, 50 s of CI that proved nothing more)
@pytest.mark.parametrize('opt', ['samadamw'])
def test_ctrl_c_then_the_printed_command_is_the_uninterrupted_run(tmp_path, capfd, monkeypatch, opt):
    """The uninterrupted run and the resume run ``timm-ext train`` in this process (train.py as its child); the
    interrupted one is a process group of its own, as a terminal's command line is (``python -m timm_ext train``,
    which starts train.py)."""
    if tuple(int(v) for v in torch.__version__.split('+')[0].split('.')[:2]) < (2, 5):
        pytest.skip(f'train.py\'s --resume cannot load its own checkpoint with torch {torch.__version__}')
    from timm_ext.data import digits_image_folder
    data = digits_image_folder(tmp_path / 'digits', size=16)
    args = ['--timm-train', str(TRAIN_PY), '--data-dir', str(data), '--model', 'vit_tiny_cb', '--model-kwargs',
            'img_size=16', 'patch_size=4', 'embed_dim=32', 'depth=2', 'num_heads=2', '--num-classes', '10',
            '--input-size', '3', '16', '16', '--mean', '0.5', '0.5', '0.5', '--std', '0.5', '0.5', '0.5',
            '--opt', opt, '--lr', '2e-3', '--epochs', '3', '--warmup-epochs', '1', '--sched-on-updates', '-b', '32',
            '--drop-path', '0.1', '--device', 'cpu', '--workers', '0', '--output', str(tmp_path / 'out'),
            '--log-interval', '1000']
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    monkeypatch.setenv('OMP_NUM_THREADS', '1')  # train.py's, in each of the three runs
    code, _, err = run_cli(capfd, 'train', *args, '--experiment', 'whole')
    assert code == 0, err[-3000:]

    # Ctrl-C in a terminal: SIGINT to the whole process group, once the first epoch's checkpoint is there
    # (without --experiment: train.py names the run's folder itself)
    # (SIGINT's default restored in the child: a test run started in the background inherits it ignored)
    cut = subprocess.Popen([sys.executable, '-m', 'timm_ext', 'train', *args], stderr=subprocess.PIPE,
                           stdout=subprocess.DEVNULL, text=True, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while not list((tmp_path / 'out').glob('2*/last.pth.tar')) and time.time() < deadline and cut.poll() is None:
        time.sleep(0.02)
    os.killpg(cut.pid, signal.SIGINT)
    _, err = cut.communicate(timeout=300)
    assert cut.returncode == 130, err[-3000:]
    (line,) = [line for line in err.splitlines() if line.startswith('timm-ext train: interrupted; resume with: ')]
    resume = shlex.split(line.split('resume with: ', 1)[1])
    (folder,) = [p for p in (tmp_path / 'out').iterdir() if p.name != 'whole']
    assert resume == ['timm-ext', 'train', *args, '--resume', str(folder / 'last.pth.tar'), '--experiment',
                      folder.name]
    code, _, err = run_cli(capfd, *resume[1:])
    assert code == 0, err[-3000:]
    assert f'--resume {folder / "last.pth.tar"}: weights and the state of {opt}' in err

    with open(tmp_path / 'out' / 'whole' / 'summary.csv') as f:
        expected = list(csv.reader(f))
    with open(folder / 'summary.csv') as f:
        assert list(csv.reader(f)) == expected and [row[0] for row in expected] == ['epoch', '0', '1', '2']
    a = torch.load(tmp_path / 'out' / 'whole' / 'last.pth.tar', weights_only=False)
    b = torch.load(folder / 'last.pth.tar', weights_only=False)
    assert a['epoch'] == b['epoch'] == 2
    assert all(torch.equal(a['state_dict'][k], b['state_dict'][k]) for k in a['state_dict'])
