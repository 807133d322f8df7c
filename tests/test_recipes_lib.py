"""timm_ext.recipes: packaged recipes by name, and the checks of a recipe and a command line against
timm's real train.py parser (found through TIMM_EXT_TIMM_TRAIN, default ../shared/timm-train/v1.0.28)."""
import os
from pathlib import Path

import pytest
from conftest import require_timm_script

from timm_ext import recipes
from timm_ext._resources import packaged_dir
from timm_ext.recipes import (
    RecipeError,
    check_recipe,
    check_train_args,
    check_validate_args,
    find_recipe,
    is_sam_optimizer,
    list_recipes,
    load_recipe,
)
from timm_ext.scripts import load_script_parser

REPO = Path(__file__).resolve().parents[1]
_ENV = os.environ.get('TIMM_EXT_TIMM_TRAIN')
_SCRIPTS = Path(_ENV) if _ENV else REPO.parent / 'shared' / 'timm-train' / 'v1.0.28'
TRAIN_PY = _SCRIPTS if _SCRIPTS.suffix == '.py' else _SCRIPTS / 'train.py'
VALIDATE_PY = TRAIN_PY.parent / 'validate.py'
needs_train_py = pytest.mark.skipif(
    not TRAIN_PY.is_file(), reason=f'timm\'s train.py not found at {TRAIN_PY} (set TIMM_EXT_TIMM_TRAIN)')
SAM_RECIPE = {'device_modules': ['timm_ext'], 'opt': 'samadamw', 'opt_kwargs': {'rho': 0.1, 'clip_grad': 1.0}}


@pytest.fixture(scope='module')
def parser():
    return require_timm_script(TRAIN_PY)


# --- finding recipes -----------------------------------------------------------------------------

def test_packaged_recipes_are_the_repository_folder_in_a_checkout():
    assert recipes.recipes_dir() == REPO / 'recipes' == packaged_dir('recipes')
    assert packaged_dir('patches') == REPO / 'patches'
    expected = sorted(p.relative_to(REPO / 'recipes').with_suffix('').as_posix()
                      for p in (REPO / 'recipes').rglob('*.yaml'))
    assert list_recipes() == expected and 'examples/sam_minimal' in expected
    with pytest.raises(ValueError, match=r"Unknown packaged folder 'data'; one of: recipes, patches"):
        packaged_dir('data')


def test_find_recipe_by_name_or_path(tmp_path):
    path = REPO / 'recipes' / 'examples' / 'sam_minimal.yaml'
    assert find_recipe('examples/sam_minimal') == path == find_recipe('examples/sam_minimal.yaml')
    own = tmp_path / 'mine.yaml'
    own.write_text('opt: adamw\n')
    assert find_recipe(own) == own and load_recipe(own) == {'opt': 'adamw'}


def test_unknown_recipe_names_close_ones():
    with pytest.raises(RecipeError, match=r"unknown recipe 'examples/sam_minimall': not a file .* "
                                          r"\(`timm-ext recipes list`\); did you mean examples/sam_minimal\?"):
        find_recipe('examples/sam_minimall')


def test_recipe_must_be_a_mapping(tmp_path):
    bad = tmp_path / 'bad.yaml'
    bad.write_text('- opt\n- adamw\n')
    with pytest.raises(RecipeError, match=r'must be a mapping of train.py arguments, not a list'):
        load_recipe(bad)
    bad.write_text('opt: [adamw\n')
    with pytest.raises(RecipeError, match=r'is not valid YAML'):
        load_recipe(bad)
    bad.write_text('')
    assert load_recipe(bad) == {}


# --- recipe checks against train.py's parser -----------------------------------------------------

@needs_train_py
@pytest.mark.parametrize('name', list_recipes())
def test_every_packaged_recipe_fits_train_py(parser, name):
    assert check_recipe(load_recipe(find_recipe(name)), parser) == []


@needs_train_py
@pytest.mark.parametrize('recipe, expected', [
    ({'rho': 0.05}, "recipe key 'rho' is not a train.py argument (train.py ignores unknown keys silently): "
                    "SAM's rho goes under opt_kwargs, e.g. `opt_kwargs: {rho: ...}`"),
    ({'opt-kwargs': {}}, "recipe key 'opt-kwargs' is not a train.py argument (train.py ignores unknown keys "
                         "silently): did you mean 'opt_kwargs'?"),
    ({'opt': 'sam_adamw'}, "opt 'sam_adamw' builds plain adamw in timm's optimizer factory (it keeps only the text "
                           "after the last underscore), not SAM: write 'samadamw'"),
    ({'opt': 'lookahead_asam_sgd'}, "opt 'lookahead_asam_sgd' builds plain sgd in timm's optimizer factory (it keeps "
                                    "only the text after the last underscore), not SAM: write 'lookahead_asamsgd'"),
    ({'opt': 'sam_cadamw'}, "opt 'sam_cadamw' builds plain cadamw in timm's optimizer factory (it keeps only the "
                            "text after the last underscore), not SAM: write 'sam' with opt_kwargs: {base: cadamw}"),
    ({'device_modules': 'timm_ext'}, "device_modules is the string 'timm_ext': train.py would import each of its "
                                     "characters; write a list: `device_modules: [timm_ext]`"),
    ({'epochs': 1.5}, "recipe key 'epochs': 1.5 is a float; train.py expects int"),
    ({'lr': '1e-3x'}, "recipe key 'lr': '1e-3x' is not a number; train.py expects float"),
    ({'amp': 'yes'}, "recipe key 'amp': 'yes' is a str; train.py expects true or false"),
    ({'mean': 0.5}, "recipe key 'mean': 0.5 is a float; train.py expects a list, e.g. [0.5]"),
    ({'input_size': [3, 224]}, "recipe key 'input_size': [3, 224] has 2 items; train.py expects 3"),
    ({'opt_kwargs': 'rho=0.1'}, "recipe key 'opt_kwargs': 'rho=0.1' is a str; train.py expects a mapping"),
    ({'model': 7}, "recipe key 'model': 7 is an int; train.py expects text"),
    ({'kd_distill_type': 'hidden'}, "recipe key 'kd_distill_type': 'hidden' is not one of logit, feature, token"),
])
def test_recipe_misconfiguration_is_one_line_with_the_fix(parser, recipe, expected):
    assert check_recipe(recipe, parser) == [expected]


@needs_train_py
def test_values_train_py_accepts_pass(parser):
    recipe = {'lr': '1e-3', 'epochs': 3, 'warmup_lr': 0, 'mean': [0.5, 0.5, 0.5], 'amp': True,
              'opt': 'lookahead_samsgd', 'model_kwargs': {'drop_path_rate': 0.1}, 'num_classes': None,
              'device_modules': ['timm_ext']}
    assert check_recipe(recipe, parser) == []


def test_sam_names_follow_timms_factory():
    assert all(is_sam_optimizer(n) for n in ('sam', 'asam', 'samadamw', 'asamsgd', 'lookahead_samadamw'))
    assert not any(is_sam_optimizer(n) for n in ('adamw', 'sam_adamw', 'lookahead_adamw', 'nosuchopt'))


# --- whole command lines -------------------------------------------------------------------------

@needs_train_py
def test_no_cuda_without_device(parser):
    expected = ("--device is 'cuda' but CUDA is not available here (timm's scripts default to cuda): "
                "add --device cpu")
    assert check_train_args(parser, ['--model', 'resnet18'], cuda_available=False) == [expected]
    assert check_train_args(parser, ['--model', 'resnet18', '--device', 'cpu'], cuda_available=False) == []
    assert check_train_args(parser, ['--model', 'resnet18'], {'device': 'cpu'}, cuda_available=False) == []
    assert check_train_args(parser, ['--model', 'resnet18'], cuda_available=True) == []


def _image_folder(root: Path, classes: int) -> Path:
    for split in ('train', 'validation'):
        for c in range(classes):
            (root / split / f'class{c}').mkdir(parents=True)
    return root


@needs_train_py
def test_image_folder_class_count(parser, tmp_path):
    data = _image_folder(tmp_path / 'data', 3)
    base = ['--data-dir', str(data), '--device', 'cpu', '--model', 'test_resnet']
    assert check_train_args(parser, base + ['--num-classes', '3']) == []
    assert check_train_args(parser, base + ['--num-classes', '2']) == [
        f'the ImageFolder {data / "train"} has 3 classes but --num-classes is 2: add --num-classes 3']
    # not given: train.py keeps the model's own head (test_resnet has 1000 outputs)
    assert check_train_args(parser, base) == [
        f'the ImageFolder {data / "train"} has 3 classes but --num-classes is not given, so train.py keeps the '
        f'model\'s default of 1000: add --num-classes 3']
    assert check_train_args(parser, base, {'num_classes': 3}) == []  # from the recipe
    assert check_train_args(parser, base + ['--num-classes', '2', '--class-map', 'map.txt']) == []  # classes mapped
    assert check_train_args(parser, base + ['--num-classes', '2', '--dataset', 'torch/cifar10']) == []


@needs_train_py
def test_baseline_over_a_sam_recipe(parser):
    argv = ['--device', 'cpu', '--opt', 'adamw']
    assert check_train_args(parser, argv, SAM_RECIPE) == [
        "--opt adamw replaces the recipe's SAM optimizer 'samadamw', but opt_kwargs still carry SAM's rho, "
        "clip_grad, which adamw does not take: give the baseline its own --opt-kwargs (a bare `--opt-kwargs` "
        "clears them; train.py's --clip-grad clips)"]
    assert check_train_args(parser, argv + ['--opt-kwargs'], SAM_RECIPE) == []
    assert check_train_args(parser, ['--device', 'cpu', '--opt', 'asamsgd'], SAM_RECIPE) == []  # still SAM
    assert check_train_args(parser, ['--device', 'cpu'], SAM_RECIPE) == []


@needs_train_py
def test_command_line_sam_underscore_and_rejected_arguments(parser):
    assert check_train_args(parser, ['--device', 'cpu', '--opt', 'sam_sgd']) == [
        "opt 'sam_sgd' builds plain sgd in timm's optimizer factory (it keeps only the text after the last "
        "underscore), not SAM: write 'samsgd'"]
    assert check_train_args(parser, ['--no-such-argument']) == []  # train.py reports it itself


def test_validate_checks(tmp_path):
    if not VALIDATE_PY.is_file():
        pytest.skip(f'timm\'s validate.py not found at {VALIDATE_PY}')
    parser = load_script_parser(VALIDATE_PY)
    missing = tmp_path / 'nope.pth.tar'
    assert check_validate_args(parser, ['--checkpoint', str(missing), '--device', 'cpu']) == [
        f'checkpoint {str(missing)!r} does not exist']
    missing.write_bytes(b'')
    assert check_validate_args(parser, ['--checkpoint', str(missing), '--device', 'cpu']) == []
    assert len(check_validate_args(parser, ['--model', 'resnet18'], cuda_available=False)) == 1
