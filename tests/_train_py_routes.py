"""A SAM-family optimizer through timm's train.py and through the demo's built-in loop (timm's parts driven by
hand, no train.py) on the same digits, the same batches: the summary.csv of both, to compare number by number.

The loop runs in this process (one torch thread, as train.py's child gets): a process of its own would add its
imports, about 5 CPU-seconds, to each of the seven tests. The loop as a process of its own, the demo's way, is
tests/test_demo_builtin_loop.py's."""
import contextlib
import dataclasses
import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import torch
from _timm_train import TRAIN_PY
from conftest import require_timm_script

EPOCHS = 2  # the warmup epoch and one after it: every update on the schedule's update-wise lr
PER_CLASS = {'train': 12, 'validation': 6}  # images of each digit: 7 updates an epoch at the demo's batch of 16


def small_digits(root: Path) -> Path:
    """The demo's digits, the first ``PER_CLASS`` images of each class copied to ``root``: the two routes agree or
    differ on any data, and a few updates an epoch keep the comparison to the processes' start-up."""
    from timm_ext.data import digits_image_folder
    from timm_ext.demo.runs import IMAGE_SIZE

    full = digits_image_folder(size=IMAGE_SIZE)
    for split, count in PER_CLASS.items():
        for cls in sorted(p for p in (full / split).iterdir() if p.is_dir()):
            (root / split / cls.name).mkdir(parents=True)
            for image in sorted(cls.iterdir())[:count]:
                shutil.copyfile(image, root / split / cls.name / image.name)
    return root


@contextlib.contextmanager
def _loop_in_this_process() -> Iterator[None]:
    """One torch thread for the loop, as its own process had with ``OMP_NUM_THREADS=1``; the root logger's handlers
    and level back as they were after (the loop adds a console handler, as train.py does at its start)."""
    root = logging.getLogger()
    handlers, level, threads = root.handlers[:], root.level, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        root.handlers[:] = handlers
        root.setLevel(level)


def both_routes(tmp_path: Path, opt: str, opt_kwargs: Dict[str, Any], loop: bool = True) -> Tuple[str, str]:
    """The demo's plain ViT run with ``opt`` and ``opt_kwargs``, ``EPOCHS`` epochs on :func:`small_digits`, through
    the built-in loop and through train.py (TIMM_EXT_TIMM_TRAIN): each route's summary.csv text (the loop's ``''``
    with ``loop=False``, which starts train.py alone)."""
    from timm_ext.demo.runs import demo_runs
    from timm_ext.demo.train_runs import train_command
    from timm_ext.launch.build_command import child_env

    require_timm_script(TRAIN_PY)
    data = small_digits(tmp_path / 'digits')
    run = dataclasses.replace(demo_runs(quick=True)[0], name='run', opt=opt, opt_kwargs=dict(opt_kwargs))
    env = dict(child_env(), HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1')  # one thread, as the loop: an exact comparison
    if loop:
        from timm_ext.demo.builtin_loop import main as builtin_loop

        with _loop_in_this_process():
            assert builtin_loop(run.train_args(data, tmp_path / 'loop', EPOCHS)) == 0
    command = train_command(run.training(data, EPOCHS), tmp_path / 'train_py', TRAIN_PY)
    done = subprocess.run(command.argv, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    loop_csv = (tmp_path / 'loop' / 'run' / 'summary.csv').read_text() if loop else ''
    return loop_csv, (tmp_path / 'train_py' / 'run' / 'summary.csv').read_text()
