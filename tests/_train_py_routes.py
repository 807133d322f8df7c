"""A SAM-family optimizer through timm's train.py and through the demo's built-in loop (timm's parts driven by
hand, no train.py) on the same digits, the same batches: the summary.csv of both, to compare number by number."""
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Tuple

from _timm_train import TRAIN_PY
from conftest import require_timm_script

EPOCHS = 2  # the warmup epoch and one after it: every update on the schedule's update-wise lr


def both_routes(tmp_path: Path, opt: str, opt_kwargs: Dict[str, Any]) -> Tuple[str, str]:
    """The demo's plain ViT run with ``opt`` and ``opt_kwargs``, ``EPOCHS`` epochs, through the built-in loop and
    through train.py (TIMM_EXT_TIMM_TRAIN): each route's summary.csv text."""
    from timm_ext.data import digits_image_folder
    from timm_ext.demo.runs import IMAGE_SIZE, demo_runs
    from timm_ext.demo.train_runs import train_command
    from timm_ext.launch.build_command import child_env

    require_timm_script(TRAIN_PY)
    data = digits_image_folder(size=IMAGE_SIZE)
    run = dataclasses.replace(demo_runs(quick=True)[0], name='run', opt=opt, opt_kwargs=dict(opt_kwargs))
    env = dict(child_env(), HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1')  # one thread each side: an exact comparison
    argv = run.train_args(data, tmp_path / 'loop', EPOCHS)
    loop = subprocess.run([sys.executable, '-m', 'timm_ext.demo.builtin_loop', *argv], env=env, capture_output=True,
                          text=True, timeout=600)  # a process of its own: its logging set up there, not in pytest's
    assert loop.returncode == 0, (loop.stdout + loop.stderr)[-6000:]
    command = train_command(run.training(data, EPOCHS), tmp_path / 'train_py', TRAIN_PY)
    done = subprocess.run(command.argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return tuple((tmp_path / route / 'run' / 'summary.csv').read_text() for route in ('loop', 'train_py'))
