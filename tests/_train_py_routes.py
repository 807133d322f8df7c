"""A SAM-family optimizer through timm's train.py and through the demo's built-in loop (timm's parts driven by
hand, no train.py) on the same digits, the same batches: the summary.csv of both, to compare number by number."""
import dataclasses
import subprocess
from pathlib import Path
from typing import Any, Dict, Tuple

import torch
from _timm_train import TRAIN_PY
from conftest import require_timm_script

EPOCHS = 2  # the warmup epoch and one after it: every update on the schedule's update-wise lr


def both_routes(tmp_path: Path, opt: str, opt_kwargs: Dict[str, Any]) -> Tuple[str, str]:
    """The demo's plain ViT run with ``opt`` and ``opt_kwargs``, ``EPOCHS`` epochs, through the built-in loop and
    through train.py (TIMM_EXT_TIMM_TRAIN): each route's summary.csv text."""
    from timm_ext.data import digits_image_folder
    from timm_ext.demo.builtin_loop import main
    from timm_ext.demo.runs import IMAGE_SIZE, demo_runs
    from timm_ext.demo.train_runs import train_command
    from timm_ext.launch.build_command import child_env

    require_timm_script(TRAIN_PY)
    data = digits_image_folder(size=IMAGE_SIZE)
    run = dataclasses.replace(demo_runs(quick=True)[0], name='run', opt=opt, opt_kwargs=dict(opt_kwargs))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # an exact comparison runs at one thread count on both sides (train.py: one thread)
    try:
        assert main(run.train_args(data, tmp_path / 'loop', EPOCHS)) == 0
    finally:
        torch.set_num_threads(threads)
    command = train_command(run.training(data, EPOCHS), tmp_path / 'train_py', TRAIN_PY)
    done = subprocess.run(command.argv, env=dict(child_env(), HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1'),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return tuple((tmp_path / route / 'run' / 'summary.csv').read_text() for route in ('loop', 'train_py'))
