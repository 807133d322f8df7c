"""Every private timm name timm-ext relies on, behind one accessor each.

timm does not promise these names: a release may rename or reshape any of them. Keeping them here means one
file to fix, and ``tests/test_timm_compat.py`` fails with the name that changed instead of a distant
``AttributeError``. Each entry names the timm versions it was checked against: the tests ran under 1.0.22,
1.0.28 and 1.0.31 (tests/_timm_venvs.py), the source of 1.0.23 was read.

Not listed, because timm exports them publicly: ``timm.layers._assert`` (a re-export in ``timm.layers``'s
namespace that timm's own models import), the ``fused_attn`` flag of timm's attention modules.
"""
import argparse
from types import CodeType
from typing import TYPE_CHECKING, List, Mapping, Tuple

# timm.models._features.feature_take_indices: checked against timm 1.0.22, 1.0.23, 1.0.28 and 1.0.31
# (not exported by timm.models; (num_features, indices=None, as_set=False) -> (sorted indices, max index)).
from timm.models._features import feature_take_indices

if TYPE_CHECKING:
    from timm.optim import OptimInfo, OptimizerRegistry

__all__ = ['FACTORY_MODEL_ARG', 'default_optimizer_registry', 'eval_split_synonyms', 'feature_take_indices',
           'optimizer_factory_code', 'parser_actions', 'registry_optimizers', 'search_split',
           'train_split_synonyms']


# timm.data.dataset_factory._search_split / _TRAIN_SYNONYM / _EVAL_SYNONYM: checked against timm 1.0.22, 1.0.23,
# 1.0.28 and 1.0.31.
def search_split(root: str, split: str) -> str:
    """The folder timm's ``create_dataset`` reads ``split`` from under ``root`` (``_search_split``): ``root/split``
    if it exists, else the first existing synonym folder (train/training, val/valid/validation/eval/evaluation),
    else ``root`` itself."""
    from timm.data.dataset_factory import _search_split
    return _search_split(root, split)


def train_split_synonyms() -> Tuple[str, ...]:
    """Split names timm treats as the training split, in the order it searches them (``_TRAIN_SYNONYM``)."""
    from timm.data.dataset_factory import _TRAIN_SYNONYM
    return tuple(_TRAIN_SYNONYM)


def eval_split_synonyms() -> Tuple[str, ...]:
    """Split names timm treats as the evaluation split, in the order it searches them (``_EVAL_SYNONYM``)."""
    from timm.data.dataset_factory import _EVAL_SYNONYM
    return tuple(_EVAL_SYNONYM)


# argparse.ArgumentParser._actions / argparse._HelpAction (stdlib, Python 3.8-3.13): how timm's train.py parser
# is read. Listed here because the issue counts it with timm's private names.
def parser_actions(parser: argparse.ArgumentParser) -> List[argparse.Action]:
    """The parser's actions (its options and positionals) in definition order, without ``-h/--help``."""
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


# timm.optim._optim_factory.default_registry and OptimizerRegistry._optimizers: checked against timm 1.0.22,
# 1.0.23, 1.0.28 and 1.0.31 (a dict name -> OptimInfo; aliases map to the same OptimInfo).
def default_optimizer_registry() -> 'OptimizerRegistry':
    """The registry behind ``timm.optim.create_optimizer_v2`` / ``list_optimizers`` (not exported by timm)."""
    from timm.optim._optim_factory import default_registry
    return default_registry


def registry_optimizers(registry: 'OptimizerRegistry') -> Mapping[str, 'OptimInfo']:
    """The live name -> ``OptimInfo`` mapping of ``registry`` (aliases included), for membership tests
    before registering (``register`` raises on a duplicate; ``list_optimizers`` filters deprecated ones)."""
    return registry._optimizers


# OptimizerRegistry.create_optimizer's first argument is named ``model_or_params``: checked against timm 1.0.22,
# 1.0.23, 1.0.28 and 1.0.31. SAM finds the model it is built for by walking up to that frame and reading that local.
FACTORY_MODEL_ARG = 'model_or_params'


def optimizer_factory_code() -> CodeType:
    """The code object of ``OptimizerRegistry.create_optimizer`` (the frame ``create_optimizer_v2`` builds in)."""
    from timm.optim import OptimizerRegistry
    return OptimizerRegistry.create_optimizer.__code__
