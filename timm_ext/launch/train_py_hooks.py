"""What timm-ext adds to a run of timm's own train.py that imports it (``--device-modules timm_ext``), so that
``--resume`` continues the run instead of starting a slightly different one.

* **The random state is checkpointed.** train.py saves the weights, the optimizer, the loss scaler and the EMA,
  but no random state: a resumed run draws other batches (the sampler's order), other crops and other
  drop-path masks than the uninterrupted run would have. The optimizer that timm's factory builds gets a
  state-dict hook that adds torch's (CPU and CUDA), numpy's and Python's random states, as they are when
  train.py saves the checkpoint (after the epoch's evaluation), and a load hook that puts them back when
  ``--resume`` loads the optimizer (before the next epoch draws anything). With ``--workers 0`` the resumed run
  then gives the uninterrupted run's weights bit for bit (``tests/test_launch_train_py_hooks.py``). Data-loader
  worker processes keep random states of their own that train.py cannot reach, so with ``--workers N`` the
  augmentations of a resumed run still differ (docs/cli.md, "Interrupting and resuming").
* **summary.csv is continued.** train.py asks for a header row at the first epoch of every process
  (``write_header=best_metric is None``), so a resumed run wrote a second header into the run's summary.csv;
  a file that already starts with the same header gets none.
* **SAM replays the training task.** Every SAM-family optimizer timm's factory builds is opted in to
  ``timm_ext.optim.replay_timm_task``: its ``step()`` without a closure replays the task's calls at w + e.

Installed once per process, only when the ``__main__`` module is timm's train.py (a script named train*.py with
``main`` and ``train_one_epoch``): ``import timm_ext`` anywhere else changes nothing.
"""
import csv
import functools
import inspect
import os
import random
import sys
import weakref
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

from timm_ext.optim.task_replay import replay_timm_task, sams_in

__all__ = ['RNG_KEY', 'continuing_summary', 'install_train_py_hooks', 'is_train_py', 'random_state',
           'set_random_state']

RNG_KEY = 'timm_ext_random_state'  # the key in the optimizer's state dict
_MARK = '_timm_ext_train_py_hook'
# the random state a load_state_dict call brought, by optimizer, between its pre and post hooks
_loaded: 'weakref.WeakKeyDictionary[torch.optim.Optimizer, Dict[str, Any]]' = weakref.WeakKeyDictionary()


def is_train_py(module: Optional[ModuleType]) -> bool:
    """Whether ``module`` (normally ``sys.modules['__main__']``) is a timm train.py, patched or not."""
    path = os.path.basename(getattr(module, '__file__', None) or '')
    return path.startswith('train') and path.endswith('.py') and all(
        callable(getattr(module, name, None)) for name in ('main', 'train_one_epoch'))


def random_state() -> Dict[str, Any]:
    """torch's (CPU, and every CUDA device once CUDA is initialised), numpy's and Python's random states, as
    tensors and plain values (a weights-only ``torch.load`` reads them back)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: Dict[str, Any] = {
        'torch': torch.get_rng_state(),
        'numpy': [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        'python': random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_random_state(state: Dict[str, Any]) -> None:
    """Put back what :func:`random_state` returned (CUDA states only where the device count matches)."""
    torch.set_rng_state(state['torch'])
    kind, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))
    cuda = state.get('cuda')
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _add_random_state(optimizer: torch.optim.Optimizer, state_dict: Dict[str, Any]) -> Dict[str, Any]:
    state_dict[RNG_KEY] = random_state()
    return state_dict


def _take_random_state(optimizer: torch.optim.Optimizer, state_dict: Dict[str, Any]) -> Dict[str, Any]:
    state_dict = dict(state_dict)
    state = state_dict.pop(RNG_KEY, None)
    if state is not None:
        _loaded[optimizer] = state
    return state_dict


def _restore_random_state(optimizer: torch.optim.Optimizer) -> None:
    state = _loaded.pop(optimizer, None)
    if state is not None:
        set_random_state(state)


def _checkpointing_random_state(create_optimizer: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(create_optimizer)
    def create(*args: Any, **kwargs: Any) -> Any:
        optimizer = create_optimizer(*args, **kwargs)
        if sams_in(optimizer):  # SAM's step() replays train.py's training task, found at its first call
            replay_timm_task(optimizer)
        optimizer.register_state_dict_post_hook(_add_random_state)
        optimizer.register_load_state_dict_pre_hook(_take_random_state)
        optimizer.register_load_state_dict_post_hook(_restore_random_state)
        return optimizer

    setattr(create, _MARK, True)
    return create


def _header_of_row(epoch: Any, train_metrics: Dict[str, Any], eval_metrics: Optional[Dict[str, Any]],
                   lr: Any) -> List[str]:
    """The header timm's update_summary writes for this row."""
    header = ['epoch'] + [f'train_{k}' for k in train_metrics]
    header += [f'eval_{k}' for k in eval_metrics] if eval_metrics else []
    return header + (['lr'] if lr is not None else [])


def continuing_summary(update_summary: Callable[..., Any]) -> Callable[..., Any]:
    """``update_summary`` that writes no second header into a run's own summary.csv (a resumed run continues it)."""
    signature = inspect.signature(update_summary)

    @functools.wraps(update_summary)
    def update(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        values = bound.arguments
        filename = values.get('filename')
        if values.get('write_header') and filename and os.path.isfile(filename) and os.path.getsize(filename):
            with open(filename, newline='') as f:
                first = next(csv.reader(f), None)
            header = _header_of_row(values.get('epoch'), values.get('train_metrics') or {},
                                    values.get('eval_metrics'), values.get('lr'))
            if first == header:
                bound.arguments['write_header'] = False  # the run's own file: continue it
        return update_summary(*bound.args, **bound.kwargs)

    setattr(update, _MARK, True)
    return update


def install_train_py_hooks() -> List[str]:
    """Install both hooks (idempotent); what was hooked."""
    import timm.utils

    from timm_ext._timm_compat import default_optimizer_registry

    hooked = []
    registry = default_optimizer_registry()
    if not getattr(registry.create_optimizer, _MARK, False):
        registry.create_optimizer = _checkpointing_random_state(registry.create_optimizer)
    hooked.append('random state in the optimizer\'s state dict')
    if not getattr(timm.utils.update_summary, _MARK, False):
        timm.utils.update_summary = continuing_summary(timm.utils.update_summary)
    hooked.append('summary.csv continued on resume')
    return hooked


def install_if_train_py() -> List[str]:
    """:func:`install_train_py_hooks` when this process runs timm's train.py; nothing otherwise."""
    return install_train_py_hooks() if is_train_py(sys.modules.get('__main__')) else []
