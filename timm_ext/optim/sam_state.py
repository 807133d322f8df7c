"""SAM's checkpoint, copy and pickle handling, and the setting attributes, all derived from its settings
declaration (``timm_ext.optim.sam_settings``).

The state dict is the base optimizer's (its state, and the groups, which carry ``rho``/``adaptive``/``eta``)
plus a ``"sam"`` entry: the family's optimizer-wide settings and the update count. A loaded entry is
validated before anything is loaded, wins over this run's settings (a resumed run continues exactly),
and each setting it changes is logged. A copy or a pickle keeps the settings, the base optimizer, the
model and the update count; hooks, caches and the task recorder are rebuilt, as torch's optimizers do.
"""
import logging
from typing import Any, Dict, List, Tuple

from timm_ext.optim.sam_settings import SAMSettings, check_group

__all__ = ['SAMCheckpoint']

_logger = logging.getLogger('timm_ext.optim.sam')

# what a copy or a pickle keeps besides a subclass's ``_extra_persistent``
_PERSISTENT = ('base_optimizer', 'settings', 'model', '_perturbed', '_skip', '_second_pass_scale', '_step_count')


class SAMCheckpoint:
    """The part of :class:`timm_ext.optim.SAM` that saves, loads, copies and shows it."""
    settings: SAMSettings

    # ---- the settings as attributes: ``opt.clip_grad``, ``opt.rho_max``; assigning one checks it -------

    def __getattr__(self, name: str) -> Any:
        settings = self.__dict__.get('settings')
        if settings is not None and name in settings.optimizer_names():
            return getattr(settings, name)
        raise AttributeError(f'{type(self).__name__!r} object has no attribute {name!r}')

    def __setattr__(self, name: str, value: Any) -> None:
        settings = self.__dict__.get('settings')
        if settings is not None and name in settings.optimizer_names():
            self.__dict__['settings'] = settings.replace(**{name: value})
        else:
            super().__setattr__(name, value)

    @property
    def sam_defaults(self) -> Dict[str, Any]:
        """What each parameter group gets unless it carries its own (``rho``, ``adaptive``, ``eta``)."""
        return self.settings.group_defaults()

    def __repr__(self) -> str:
        values = ', '.join(f'{k}={v!r}' for k, v in self.settings.optimizer_values().items())
        return f'{type(self).__name__}({self.base_optimizer!r}, {values})'

    # ---- copy and pickle -------------------------------------------------------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        if self._perturbed is not None:
            raise RuntimeError('SAM cannot be copied or pickled between first_step() and second_step()')
        return {k: self.__dict__[k] for k in _PERSISTENT + self._extra_persistent()}

    def _extra_persistent(self) -> Tuple[str, ...]:
        """Attributes a subclass adds to what a copy or a pickle keeps."""
        return ()

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state = dict(state)
        if 'settings' not in state:  # pickled before the settings were one object: one attribute each
            values = dict(state.pop('sam_defaults', {}))
            values.update({k: state.pop(k) for k in list(state) if k in self.Settings.init_names()})
            state['settings'] = self.Settings(**{k: v for k, v in values.items() if k in self.Settings.init_names()})
        self.__dict__.update(state)
        self._init_runtime()

    # ---- checkpoints -------------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The base optimizer's state dict (its state and the groups, which carry rho/adaptive/eta)
        plus SAM's own settings and step count, so a resumed run continues exactly. State-dict hooks apply."""
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        state_dict = self.base_optimizer.state_dict()
        state_dict['sam'] = self._sam_state()
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, state_dict)
            if result is not None:
                state_dict = result
        return state_dict

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a SAM state dict, or a plain state dict of the base optimizer (groups get SAM's defaults).

        Everything SAM reads is validated before anything is loaded; the checkpoint's SAM settings
        win (a resumed run continues exactly), and where they differ from this run's, that is logged.
        """
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        state_dict = dict(state_dict)
        loaded = self._checked_sam_state(state_dict.pop('sam', None))
        for idx, group in enumerate(state_dict.get('param_groups', [])):
            check_group(group, f' in param group {idx} of the loaded state dict')
        changes = self._setting_changes(state_dict.get('param_groups', []), loaded)
        self.base_optimizer.load_state_dict(state_dict)
        self._add_group_defaults()
        self._apply_sam_state(loaded)
        if changes:
            _logger.warning('SAM settings from the loaded state dict replace this run\'s: %s', '; '.join(changes))
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _sam_state(self) -> Dict[str, Any]:
        """SAM's own entry of the state dict: its settings and how many updates it has made."""
        return dict(self.settings.optimizer_values(), step=self._step_count)

    def _checked_sam_state(self, sam_state: Any) -> Dict[str, Any]:
        """The loaded "sam" entry, validated; keys an older checkpoint lacks keep this run's values."""
        current = self._sam_state()
        if sam_state is None:
            return current
        if not isinstance(sam_state, dict) or not {'clip_grad', 'clip_mode'} <= set(sam_state):
            raise ValueError(f'SAM state dict entry "sam" must be a dict with clip_grad and clip_mode, '
                             f'got {sam_state!r}')
        merged = dict(current, **sam_state)
        where = ' in the loaded state dict'
        self._settings_from(merged, where)
        step = merged['step']
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f'SAM step count must be an integer >= 0, got step={step!r}{where}')
        return merged

    def _settings_from(self, values: Dict[str, Any], where: str = '') -> SAMSettings:
        """This run's settings with the optimizer-wide ones of ``values`` (a loaded entry), checked."""
        names = self.settings.init_names()
        merged = {name: getattr(self.settings, name) for name in names}
        merged.update({name: values[name] for name in self.settings.optimizer_names() if name in values})
        return type(self.settings).checked(where, **merged)

    def _apply_sam_state(self, loaded: Dict[str, Any]) -> None:
        self.__dict__['settings'] = self._settings_from(loaded)
        self._step_count = loaded['step']

    def _setting_changes(self, groups: List[Dict[str, Any]], loaded: Dict[str, Any]) -> List[str]:
        """'rho: 0.1 -> 0.05 in param groups [0, 1]'-style lines for each loaded setting that differs."""
        where: Dict[Tuple[str, Any, Any], List[int]] = {}
        for idx, (new, old) in enumerate(zip(groups, self.param_groups)):
            for key in self.settings.group_names():
                if key in new and new[key] != old.get(key):
                    where.setdefault((key, old.get(key), new[key]), []).append(idx)
        changes = [f'{key}: {old!r} -> {new!r} in param groups {idxs}' for (key, old, new), idxs in where.items()]
        current = self._sam_state()
        for key in self.settings.optimizer_names():
            if current[key] != loaded[key]:
                changes.append(f'{key}: {current[key]!r} -> {loaded[key]!r}')
        return changes
