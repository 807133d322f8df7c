"""Each private timm name timm-ext uses still exists and still behaves as ``timm_ext._timm_compat`` assumes.

A failure here names the private name that changed in the installed timm; fix its accessor in
``timm_ext/_timm_compat.py`` (one place) and re-check the timm version noted there.
"""
import argparse
import inspect
import sys

import pytest
import timm
import torch
import torch.nn as nn
from timm.optim import OptimInfo, OptimizerRegistry, list_optimizers

from timm_ext import _timm_compat as compat


def _changed(name: str, what: str) -> str:
    return f'timm {timm.__version__} changed private {name}: {what}; update timm_ext/_timm_compat.py'


def test_search_split_prefers_the_split_then_its_synonyms(tmp_path):
    try:
        (tmp_path / 'validation').mkdir()
        assert compat.search_split(str(tmp_path), 'val') == str(tmp_path / 'validation')
        (tmp_path / 'val').mkdir()
        assert compat.search_split(str(tmp_path), 'val') == str(tmp_path / 'val')
        assert compat.search_split(str(tmp_path), 'train') == str(tmp_path)
    except (ImportError, AssertionError, TypeError) as e:
        pytest.fail(_changed('timm.data.dataset_factory._search_split', repr(e)))


def test_split_synonyms_are_timms_search_order():
    try:
        train, evaluation = compat.train_split_synonyms(), compat.eval_split_synonyms()
    except ImportError as e:
        pytest.fail(_changed('timm.data.dataset_factory._TRAIN_SYNONYM/_EVAL_SYNONYM', repr(e)))
    assert train == ('train', 'training'), _changed('_TRAIN_SYNONYM', f'now {train}')
    assert evaluation == ('val', 'valid', 'validation', 'eval', 'evaluation'), \
        _changed('_EVAL_SYNONYM', f'now {evaluation}')


def test_parser_actions_lists_options_without_help():
    parser = argparse.ArgumentParser()
    parser.add_argument('--lr', type=float)
    parser.add_argument('data', nargs='?')
    assert [a.dest for a in compat.parser_actions(parser)] == ['lr', 'data'], \
        'argparse.ArgumentParser._actions / argparse._HelpAction changed'


def test_default_registry_is_the_one_create_optimizer_v2_uses():
    try:
        registry = compat.default_optimizer_registry()
    except ImportError as e:
        pytest.fail(_changed('timm.optim._optim_factory.default_registry', repr(e)))
    assert isinstance(registry, OptimizerRegistry), _changed('default_registry', type(registry).__name__)
    assert set(list_optimizers()) <= set(compat.registry_optimizers(registry)), \
        _changed('OptimizerRegistry._optimizers', 'does not hold every listed optimizer')


def test_registry_optimizers_is_the_live_name_to_info_mapping():
    registry = OptimizerRegistry()
    registry.register(OptimInfo(name='compat_probe', opt_class=object))
    registry.register_alias('compat_alias', 'compat_probe')
    try:
        known = compat.registry_optimizers(registry)
    except AttributeError as e:
        pytest.fail(_changed('OptimizerRegistry._optimizers', repr(e)))
    assert set(known) == {'compat_probe', 'compat_alias'}, _changed('OptimizerRegistry._optimizers', f'{known}')
    assert known['compat_alias'] is known['compat_probe']


def test_optimizer_factory_frame_holds_the_model_under_the_known_name():
    code = compat.optimizer_factory_code()
    assert code.co_varnames[1] == compat.FACTORY_MODEL_ARG, _changed(
        'OptimizerRegistry.create_optimizer', f'its first argument is now {code.co_varnames[1]!r}')
    model, seen = nn.Linear(2, 2), []

    def probe(params, **kwargs):  # built inside create_optimizer; finds the model as SAM does
        frame = sys._getframe(1)
        while frame is not None and frame.f_code is not code:
            frame = frame.f_back
        seen.append(frame.f_locals.get(compat.FACTORY_MODEL_ARG) if frame is not None else None)
        return torch.optim.SGD(params, **kwargs)

    registry = OptimizerRegistry()
    registry.register(OptimInfo(name='compatprobe', opt_class=probe))
    registry.create_optimizer(model, 'compatprobe', lr=0.1)
    assert seen == [model], _changed('OptimizerRegistry.create_optimizer', f'the frame held {seen}')


def test_feature_take_indices_resolves_negative_and_count_indices():
    params = list(inspect.signature(compat.feature_take_indices).parameters)
    assert params[:2] == ['num_features', 'indices'], _changed('timm.models._features.feature_take_indices', params)
    assert compat.feature_take_indices(4, 2) == ([2, 3], 3)
    assert compat.feature_take_indices(4, [0, -1]) == ([0, 3], 3)
