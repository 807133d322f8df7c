"""SAM's entry in the optimizer state dict: build it, check a loaded one, and say which settings it changes.

The state dict is the base optimizer's (its per-parameter state, LookSAM's kept direction included, and the
groups, which carry ``rho``/``adaptive``/``eta``) plus a ``"sam"`` entry: the family's optimizer-wide settings,
the update count (``step``) and, once fp16 training under torch's attribute contract made one, the state of
SAM's second-pass ``GradScaler`` (``second_pass_scaler``). Each group carries a copy of the entry under
``"sam_state"``, because ``torch.distributed.checkpoint`` (FSDP2) keeps only ``state`` and ``param_groups``. A
loaded entry is checked before anything is loaded and wins over this run's settings, so a resumed run continues
exactly; each setting it changes is logged. ``SAMCheckpointing`` gives SAM its ``state_dict`` and ``load_state_dict``.
"""
import logging
from typing import Any, Dict, List, Tuple

from torch.optim import Optimizer

from timm_ext.optim.base_optimizer import step_state_keys
from timm_ext.optim.sam_settings import SAMSettings

__all__ = ['GROUP_KEY', 'SAMCheckpointing', 'check_base_state', 'checked_entry', 'load_sam_state', 'sam_entry',
           'sam_state_dict', 'setting_changes', 'split_entry']

_logger = logging.getLogger('timm_ext.optim.sam')

GROUP_KEY = 'sam_state'

_WHERE = ' in the loaded state dict'


def sam_entry(settings: SAMSettings, updates: int, kept_state: Dict[str, Any]) -> Dict[str, Any]:
    """The ``"sam"`` entry of a state dict (``kept_state``: what SAM keeps beside its settings, its scaler)."""
    return dict(settings.optimizer_values(), step=updates, **kept_state)


def split_entry(state_dict: Dict[str, Any]) -> Tuple[Dict[str, Any], Any]:
    """The base optimizer's state dict and SAM's entry (top level, else the groups' copy; None in a plain one)."""
    state_dict = dict(state_dict)
    entry = state_dict.pop('sam', None)
    groups = [dict(g) for g in state_dict.get('param_groups', [])]
    copies = [g.pop(GROUP_KEY, None) for g in groups]
    if 'param_groups' in state_dict:
        state_dict['param_groups'] = groups
    return state_dict, entry if entry is not None else next((c for c in copies if c is not None), None)


def checked_entry(loaded: Any, current: Dict[str, Any], settings: SAMSettings) -> Tuple[Dict[str, Any], SAMSettings]:
    """The loaded entry merged over ``current`` (keys an older checkpoint lacks keep this run's values), and
    the settings it gives; a one-line ValueError naming the bad value otherwise. No entry: ``current``."""
    if loaded is None:
        return current, settings
    if not isinstance(loaded, dict) or not {'clip_grad', 'clip_mode'} <= set(loaded):
        raise ValueError(f'SAM state dict entry "sam" must be a dict with clip_grad and clip_mode, got {loaded!r}')
    merged = dict(current, **loaded)
    changes = {name: merged[name] for name in settings.optimizer_names()}
    new_settings = settings.replace(_WHERE, **changes)
    step = merged['step']
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f'SAM step count must be an integer >= 0, got step={step!r}{_WHERE}')
    scaler = merged.get('second_pass_scaler')
    if scaler is not None and not (isinstance(scaler, dict) and isinstance(scaler.get('scale'), (int, float))):
        raise ValueError(f'SAM second_pass_scaler must be a GradScaler state dict (with its "scale"), got '
                         f'second_pass_scaler={scaler!r}{_WHERE}')
    return merged, new_settings


def setting_changes(settings: SAMSettings, groups: List[Dict[str, Any]], loaded_groups: List[Dict[str, Any]],
                    current: Dict[str, Any], loaded: Dict[str, Any]) -> List[str]:
    """'rho: 0.1 -> 0.05 in param groups [0, 1]'-style lines, one per loaded setting that differs."""
    where: Dict[Tuple[str, Any, Any], List[int]] = {}
    for idx, (new, old) in enumerate(zip(loaded_groups, groups)):
        for key in settings.group_names():
            if key in new and new[key] != old.get(key):
                where.setdefault((key, old.get(key), new[key]), []).append(idx)
    changes = [f'{key}: {old!r} -> {new!r} in param groups {idxs}' for (key, old, new), idxs in where.items()]
    for key in settings.optimizer_names():
        if current[key] != loaded[key]:
            changes.append(f'{key}: {current[key]!r} -> {loaded[key]!r}')
    return changes


def sam_state_dict(base_optimizer: Optimizer, settings: SAMSettings, updates: int,
                   kept_state: Dict[str, Any]) -> Dict[str, Any]:
    """The base optimizer's state dict plus the ``"sam"`` entry, also copied into each group (for DCP)."""
    state_dict = base_optimizer.state_dict()
    state_dict['sam'] = sam_entry(settings, updates, kept_state)
    for group in state_dict['param_groups']:  # where torch.distributed.checkpoint keeps it (it drops 'sam')
        group[GROUP_KEY] = dict(state_dict['sam'])
    return state_dict


def check_base_state(base_optimizer: Optimizer, state_dict: Dict[str, Any], family: str = 'SAM') -> None:
    """A one-line ValueError when a loaded parameter's state lacks a key the base optimizer's step keeps (SGD's
    ``momentum_buffer`` loaded into AdamW): torch would stop half loaded (``KeyError: 'step'``) or at the next
    step, or start that moment from zero. Each parameter is compared with a probe of the base optimizer's class
    (:func:`~timm_ext.optim.base_optimizer.step_state_keys`) under the loaded group's hyperparameters over this
    run's; a state dict whose groups do not match this optimizer's in number or size is left to torch's own error."""
    saved_groups, loaded = state_dict.get('param_groups') or [], state_dict.get('state') or {}
    groups = base_optimizer.param_groups
    if not loaded or len(saved_groups) != len(groups) or any(
            len(saved.get('params', ())) != len(group['params']) for saved, group in zip(saved_groups, groups)):
        return
    probed: Dict[Tuple[Any, ...], Any] = {}
    for idx, (saved, group) in enumerate(zip(saved_groups, groups)):
        for saved_id, param in zip(saved['params'], group['params']):
            have = loaded.get(saved_id)
            if not isinstance(have, dict) or not have:
                continue
            like = (idx, tuple(param.shape), param.dtype)
            if like not in probed:  # this run's hyperparameters where the loaded group has none (SGD's momentum)
                probed[like] = step_state_keys(type(base_optimizer), {**group, **saved}, param)
            needs = probed[like] or ()
            if any(key not in have for key in needs):
                name = type(base_optimizer).__name__
                raise ValueError(f'{family} cannot load this state dict: its per-parameter state has '
                                 f'{", ".join(map(str, have))}, {name}\'s needs {", ".join(needs)}: it was saved by '
                                 f'another base optimizer; wrap that one, or load the model\'s weights only and start '
                                 f'the optimizer fresh')


def load_sam_state(base_optimizer: Optimizer, settings: SAMSettings, updates: int, kept_state: Dict[str, Any],
                   state_dict: Dict[str, Any]) -> Tuple[SAMSettings, int, Dict[str, Any]]:
    """Check everything, then load the base optimizer's part; returns the settings, update count and entry to
    continue with (the checkpoint's), after logging each setting that differs from this run's."""
    state_dict, loaded = split_entry(state_dict)
    current = sam_entry(settings, updates, kept_state)
    entry, new_settings = checked_entry(loaded, current, settings)
    groups = state_dict.get('param_groups', [])
    for idx, group in enumerate(groups):
        settings.check_group(group, f' in param group {idx} of the loaded state dict')
    check_base_state(base_optimizer, state_dict, settings.family)
    changes = setting_changes(settings, base_optimizer.param_groups, groups, current, entry)
    base_optimizer.load_state_dict(state_dict)
    if changes:
        _logger.warning('SAM settings from the loaded state dict replace this run\'s: %s', '; '.join(changes))
    return new_settings, entry['step'], entry


class SAMCheckpointing:
    """SAM's ``state_dict`` / ``load_state_dict`` (torch's hooks around both), from its base optimizer, settings,
    update count and second-pass scaler."""
    base_optimizer: Optimizer
    settings: SAMSettings
    _updates: int
    second_pass: Any

    def state_dict(self) -> Dict[str, Any]:
        """The base optimizer's (groups carry rho/adaptive/eta) + ``"sam"``: settings and update count, for resume."""
        return self._with_state_dict_hooks(lambda: sam_state_dict(
            self.base_optimizer, self.settings, self._updates, self.second_pass.entry()))

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """A SAM state dict, or the base optimizer's: all checked first; its settings win, each change logged."""
        def load(state_dict: Dict[str, Any]) -> None:
            self.settings, self._updates, entry = load_sam_state(
                self.base_optimizer, self.settings, self._updates, self.second_pass.entry(), state_dict)
            self.second_pass.load_state_dict(entry.get('second_pass_scaler'))
            self._add_group_defaults()
        self._with_load_state_dict_hooks(state_dict, load)
