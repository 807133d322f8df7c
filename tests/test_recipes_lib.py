"""timm_ext.recipes: packaged recipes by name, the checks of a recipe file against timm's real train.py parser
(found through TIMM_EXT_TIMM_TRAIN, default ../shared/timm-train/v1.0.28), and the paper recipes against their
paper-values tables and the generated index (a whole command line: tests/test_launch_command_checks.py)."""
import copy
import csv
import functools
import importlib
from pathlib import Path

import pytest
import yaml
from _timm_train import TRAIN_PY
from conftest import require_timm_script

from timm_ext import recipes
from timm_ext._resources import packaged_dir
from timm_ext._timm_compat import parser_actions
from timm_ext.recipes import (
    INDEX_COLUMNS,
    INDEX_MARKERS,
    RecipeError,
    build_index,
    check_against_paper,
    check_recipe,
    close_recipe_names,
    find_paper_row,
    find_recipe,
    format_index,
    format_index_markdown,
    is_sam_optimizer,
    list_recipes,
    load_paper_values,
    load_recipe,
    packaged_row,
)

REPO = Path(__file__).resolve().parents[1]
needs_train_py = pytest.mark.skipif(
    not TRAIN_PY.is_file(), reason=f'timm\'s train.py not found at {TRAIN_PY} (set TIMM_EXT_TIMM_TRAIN)')


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


def test_close_names_compare_file_names_not_shared_folders():
    """A hundred recipes share ``<paper>/<dataset>/``: only the file name decides, the same folder first."""
    names = ['vit-sam/cifar10/vit_b16_sam_finetune', 'vit-sam/imagenet/resnet50', 'vit-sam/imagenet/vit_s16_sam',
             'how-do-vits-work/imagenet/vit_s16_sam']
    assert close_recipe_names('vit-sam/imagenet/nope', names) == []
    assert close_recipe_names('how-do-vits-work/imagenet/vit_s16_sm', names)[:2] == [
        'how-do-vits-work/imagenet/vit_s16_sam', 'vit-sam/imagenet/vit_s16_sam']
    assert close_recipe_names('resnet_50', names) == ['vit-sam/imagenet/resnet50']
    assert 'vit-sam/cifar10/vit_b16_sam_finetune' in close_recipe_names('vit-sam/imagenet/vit_b16', names)  # cut short


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
    # KD_CHOICES: train.py's own; release-aware, as train.py differs: v1.0.23 has logit, feature; v1.0.28 adds token
    ({'kd_distill_type': 'hidden'}, "recipe key 'kd_distill_type': 'hidden' is not one of KD_CHOICES"),
    ({'bce_loss': True, 'smoothing': 0.0}, "bce_loss is true but smoothing is 0 and mixup / cutmix are off: train.py "
                                           "then trains with softmax cross-entropy and ignores bce_loss; for the "
                                           "sigmoid loss without smoothing set a negligible smoothing, e.g. "
                                           "`smoothing: 1.0e-06`"),
])
def test_recipe_misconfiguration_is_one_line_with_the_fix(parser, recipe, expected):
    kd_choices = next(a.choices for a in parser_actions(parser) if a.dest == 'kd_distill_type')
    assert check_recipe(recipe, parser) == [expected.replace('KD_CHOICES', ', '.join(kd_choices))]


@needs_train_py
def test_bce_loss_needs_mixup_or_smoothing_in_train_py(parser):
    """train.py v1.0.28 builds BinaryCrossEntropy in its mixup and smoothing branches only."""
    assert check_recipe({'bce_loss': True}, parser) == []  # train.py's default smoothing 0.1
    assert check_recipe({'bce_loss': True, 'smoothing': 0.0, 'mixup': 0.5}, parser) == []
    assert check_recipe({'bce_loss': True, 'smoothing': 0.0, 'cutmix': 1.0}, parser) == []
    assert check_recipe({'bce_loss': True, 'smoothing': 1e-6}, parser) == []
    assert check_recipe({'bce_loss': False, 'smoothing': 0.0}, parser) == []


@needs_train_py
def test_values_train_py_accepts_pass(parser):
    recipe = {'lr': '1e-3', 'epochs': 3, 'warmup_lr': 0, 'mean': [0.5, 0.5, 0.5], 'amp': True,
              'opt': 'lookahead_samsgd', 'model_kwargs': {'drop_path_rate': 0.1}, 'num_classes': None,
              'device_modules': ['timm_ext']}
    assert check_recipe(recipe, parser) == []


def test_sam_names_follow_timms_factory():
    assert all(is_sam_optimizer(n) for n in ('sam', 'asam', 'samadamw', 'asamsgd', 'lookahead_samadamw', 'gsamadamw',
                                            'looksamadamw'))
    assert not any(is_sam_optimizer(n) for n in ('adamw', 'sam_adamw', 'lookahead_adamw', 'nosuchopt'))


def test_unknown_recipe_key_points_every_sam_setting_to_opt_kwargs(parser):
    problems = check_recipe({'interval': 5, 'm_sharpness': 2}, parser)
    assert problems == [
        "recipe key 'interval' is not a train.py argument (train.py ignores unknown keys silently): SAM's interval "
        "goes under opt_kwargs, e.g. `opt_kwargs: {interval: ...}`",
        "recipe key 'm_sharpness' is not a train.py argument (train.py ignores unknown keys silently): SAM's "
        "m_sharpness goes under opt_kwargs, e.g. `opt_kwargs: {m_sharpness: ...}`"]


# --- paper recipes: paper-values tables, index, headers ---------------------------------------------

PAPER_RECIPES = sorted(p.relative_to(REPO / 'recipes').as_posix() for p in (REPO / 'recipes').rglob('*.yaml')
                       if p.relative_to(REPO / 'recipes').parts[0] != 'examples')


@functools.lru_cache(maxsize=None)
def _paper_rows():
    return load_paper_values()  # read once, at the first test (a malformed table fails tests, not collection)


def _row(recipe: str):
    row = _paper_rows().get(recipe)
    assert row is not None, f'{recipe} has no row in timm_ext/_data/paper_values/{recipe.split("/")[0]}.yaml'
    return row


def test_every_paper_recipe_has_a_paper_row_and_every_row_a_recipe():
    assert PAPER_RECIPES
    rows = _paper_rows()
    assert [r for r in PAPER_RECIPES if r not in rows] == [], 'recipes without a paper row'
    assert [r for r in rows if r not in PAPER_RECIPES] == [], 'paper rows without a recipe file'
    papers = {r.split('/')[0] for r in PAPER_RECIPES}
    assert {'how-do-vits-work', 'vit-sam'} <= papers
    assert all(r.split('/')[1] in ('imagenet', 'cifar10', 'cifar100') for r in PAPER_RECIPES)


@pytest.mark.timm_free
def test_committed_index_is_the_generated_one():
    committed = (REPO / 'recipes' / 'index.csv').read_text()
    assert committed == format_index(build_index()), 'regenerate it: `timm-ext recipes index --write`'
    with open(REPO / 'recipes' / 'index.csv', newline='') as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == INDEX_COLUMNS == (
        'recipe', 'paper', 'dataset', 'table', 'row', 'model', 'global_batch', 'expected_top1')
    assert [r['recipe'] for r in rows] == PAPER_RECIPES
    # numbers typed from the papers: ViT-S/16-SAM 78.1 (ViT-SAM Table 2), its vanilla 78.1 - 3.7, PiT-Ti 100 - 24.1
    by_name = {r['recipe']: r for r in rows}
    assert by_name['vit-sam/imagenet/vit_s16_sam.yaml']['expected_top1'] == '78.1'
    assert by_name['vit-sam/imagenet/vit_s16.yaml']['expected_top1'] == '74.4'
    assert by_name['how-do-vits-work/cifar100/pit_ti_p2.yaml']['expected_top1'] == '75.9'
    assert by_name['how-do-vits-work/imagenet/alternet_50.yaml']['expected_top1'] == ''  # a figure only
    assert by_name['vit-sam/imagenet/mixer_b16_sam.yaml']['global_batch'] == '4096'
    readme = (REPO / 'recipes' / 'README.md').read_text()
    start, end = readme.index(INDEX_MARKERS[0]) + len(INDEX_MARKERS[0]), readme.index(INDEX_MARKERS[1])
    assert readme[start:end] == '\n' + format_index_markdown(build_index())
    assert ('| [`vit-sam/imagenet/vit_s16_sam`](vit-sam/imagenet/vit_s16_sam.yaml) | vit-sam | Table 2 | '
            'ViT-S/16-SAM | `vit_small_patch16_224` | 4096 | 78.1 |') in readme


@needs_train_py
@pytest.mark.parametrize('recipe', PAPER_RECIPES)
def test_paper_recipe_is_its_papers_setting(parser, recipe):
    """Every paper value is written in the recipe (not left to train.py's default) and equal to it, except the
    documented deviations, where the recipe holds the deviation's value."""
    row = _row(recipe)
    config = load_recipe(REPO / 'recipes' / recipe)
    assert check_against_paper(config, row, parser, explicit=True) == []
    assert config['device_modules'][0] == 'timm_ext'
    per_step = config.get('batch_size', 128) * config.get('grad_accum_steps', 1)
    assert row.global_batch % per_step == 0, (row.global_batch, per_step)


@pytest.mark.timm_models_only
@pytest.mark.parametrize('recipe', PAPER_RECIPES)
def test_paper_recipe_model_builds_as_train_py_builds_it(recipe):
    """The model name and model_kwargs exist (on the meta device: no memory, no weights), with the classes,
    dropout and drop-path train.py passes; the recipe's patch size, where it sets one, is the model's."""
    import timm
    import torch

    config = load_recipe(REPO / 'recipes' / recipe)
    for module in config['device_modules']:  # as train.py does: registers timm-ext's models
        importlib.import_module(module)
    with torch.device('meta'):
        model = timm.create_model(
            config['model'], pretrained=False, num_classes=config.get('num_classes'), drop_rate=config.get('drop', 0.),
            drop_path_rate=config.get('drop_path'), **config.get('model_kwargs', {}))
    kwargs = config.get('model_kwargs', {})
    if config.get('num_classes'):
        assert model.num_classes == config['num_classes']
    if 'patch_size' in kwargs and hasattr(model, 'patch_embed'):
        assert model.patch_embed.patch_size[0] == kwargs['patch_size']


@pytest.mark.timm_models_only
def test_mixer_with_8x8_patches_is_table_8s():
    """ViT-SAM Table 8: Mixer-S/8 20M params, Mixer-B/8 64M, 784 tokens; timm's S/16 and B/16 otherwise."""
    import timm
    import torch

    for name, ref, millions in (('mixer_s8_224', 'mixer_s16_224', 20), ('mixer_b8_224', 'mixer_b16_224', 64)):
        model, base = timm.create_model(name), timm.create_model(ref)
        assert round(sum(p.numel() for p in model.parameters()) / 1e6) in (millions, millions + 1)
        assert model.stem.num_patches == 784 and model.stem.proj.kernel_size == (8, 8)
        # the same blocks as timm's 16x16 model except the token MLP, whose input is the 784 tokens
        assert len(model.blocks) == len(base.blocks) and model.embed_dim == base.embed_dim
        assert model.blocks[0].mlp_tokens.fc1.in_features == 784
        assert model(torch.zeros(1, 3, 224, 224)).shape == (1, 1000)
    with pytest.raises(RuntimeError, match='No pretrained weights are published for mixer_s8_224'):
        timm.create_model('mixer_s8_224', pretrained=True)


@pytest.mark.parametrize('recipe', PAPER_RECIPES)
def test_paper_recipe_header_says_where_it_comes_from(recipe):
    text = (REPO / 'recipes' / recipe).read_text()
    row = _row(recipe)
    header = text[:text.index('\ndevice_modules:')]
    assert all(line.startswith('#') for line in header.strip().splitlines())
    assert row.table in header and 'Expected top-1' in header
    if row.expected_top1 is not None:
        assert str(row.expected_top1) in header
    assert f'timm-ext train -c {row.name}' in header and f'train.py -c recipes/{recipe}' in header
    missing = [key for key in row.deviations if key not in header]
    assert not missing, f'deviations not in the header: {missing}'


@needs_train_py
def test_paper_check_names_each_difference(parser):
    """ViT-SAM ViT-S/16 + SAM (Table 2 / 11 / 12): the values train.py's defaults silently change."""
    row = find_paper_row('vit-sam/imagenet/vit_s16_sam')
    recipe = load_recipe(REPO / 'recipes' / row.recipe)
    assert check_against_paper(recipe, row, parser, explicit=True) == []
    bad = copy.deepcopy(recipe)
    del bad['smoothing'], bad['color_jitter']
    bad['opt_kwargs']['rho'] = 0.05
    bad['sched'] = 'poly'
    bad['warmup_epochs'] = 10
    bad['model'] = 'vit_small_patch32_224'
    assert check_against_paper(bad, row, parser) == [
        "model is 'vit_small_patch32_224'; vit-sam Table 2 'ViT-S/16-SAM' trains 'vit_small_patch16_224'",
        "opt_kwargs.rho is 0.05 but Table 2 has 0.1 (Table 11: ViT-S/16-SAM supervised)",
        "sched is 'poly' but Table 2 has 'cosine' (Table 12: cosine decay)",
        "warmup_epochs is 10; Table 2 has 31.97 (Table 12: 10K warmup steps at batch 4096 = 31.97 epochs of "
        "1,281,167 images), and the recipe's documented deviation is 32 (train.py's --warmup-epochs takes whole "
        "epochs (32 epochs of ~312.8 updates = 10009 steps))",
        "smoothing is not set (train.py's default: 0.1); Table 2 has 0.0 (App H: no label smoothing (not listed; "
        "train.py's default 0.1 would add it)), and the recipe's documented deviation is 1e-06 (train.py builds its "
        "sigmoid (BCE) loss only when mixup or smoothing is on (smoothing 0 gives softmax cross-entropy, bce_loss "
        "ignored); 1e-6 turns it on with targets 0.999999 / 1e-9, a negligible change): write `smoothing: 1.0e-06`",
        "color_jitter is not set (train.py's default: 0.4); Table 2 has 0.0 (App H: crop + flip only (train.py adds "
        "colour jitter 0.4 when aa is unset)): write `color_jitter: 0.0`",
    ]
    # a user's recipe may leave a value to train.py when the default is the paper's; a packaged one may not
    lean = {k: v for k, v in recipe.items() if k != 'hflip'}
    assert check_against_paper(lean, row, parser) == []
    assert check_against_paper(lean, row, parser, explicit=True) == [
        "hflip is not set (train.py's default: 0.5); Table 2 has 0.5 (App H: horizontal flip with probability "
        "50%): write `hflip: 0.5`"]
    # numbers as train.py reads them: '3e-3' (YAML text) and 0.003 are the same lr
    assert check_against_paper(dict(recipe, lr='3e-3'), row, parser) == []
    lean['model_kwargs'] = {'pos_drop_rate': 0.1}
    assert check_against_paper(lean, row, parser) == [
        'model_kwargs.proj_drop_rate is not set; Table 2 has 0.1 (Table 12: dropout 0.1 (after each dense layer, '
        'ViT code)): write `model_kwargs: {proj_drop_rate: 0.1}`']


@pytest.mark.timm_free
def test_paper_rows_by_name_or_path():
    row = find_paper_row('how-do-vits-work/cifar100/alternet_50')
    assert row == find_paper_row('how-do-vits-work/cifar100/alternet_50.yaml', _paper_rows())
    assert (row.paper, row.dataset, row.model, row.global_batch) == ('how-do-vits-work', 'cifar100',
                                                                     'alternet_50_cifar', 96)
    path = REPO / 'recipes' / 'vit-sam' / 'cifar10' / 'vit_b16_sam_finetune.yaml'
    assert packaged_row(path).row == 'ViT-B/16-SAM, CIFAR-10' and packaged_row(path).expected_top1 == 98.6
    assert packaged_row(REPO / 'recipes' / 'examples' / 'sam_minimal.yaml') is None
    with pytest.raises(RecipeError, match=r"no paper row for 'vit-sam/imagenet/vit_s16_sma': .*did you mean "
                                          r"vit-sam/imagenet/vit_s16_sam"):
        find_paper_row('vit-sam/imagenet/vit_s16_sma')


_GOOD_ROW = {'table': 'Table 2', 'row': 'X', 'model': 'resnet50', 'global_batch': 256, 'expected_top1': 76.0,
             'values': {'smoothing': {'value': 0.0, 'source': 'Table 12'}}}


@pytest.mark.parametrize('edit, message', [
    (lambda d: d.update(paper='other'), r"`paper` is 'other'; it must be the file's name 'vit-sam'"),
    (lambda d: d['recipes']['vit-sam/imagenet/x.yaml'].update(global_batch=True),
     r"global_batch True must be a positive integer"),
    (lambda d: d['recipes'].update({'vit-sam/cifar5/x.yaml': _GOOD_ROW}),
     r"a recipe path must be vit-sam/<dataset>/<name>.yaml with dataset one of imagenet, cifar10, cifar100"),
    (lambda d: d['recipes']['vit-sam/imagenet/x.yaml'].pop('table'), r"'vit-sam/imagenet/x.yaml': missing table"),
    (lambda d: d['recipes']['vit-sam/imagenet/x.yaml'].update(expected_top1='76'),
     r"expected_top1 '76' must be a percentage or null"),
    (lambda d: d['recipes']['vit-sam/imagenet/x.yaml']['values'].update(lr=0.1),
     r"values 'lr' must be \{value: ..., source: \"text\"\}, not 0.1"),
    (lambda d: d['recipes']['vit-sam/imagenet/x.yaml'].update(
        deviations={'smoothing': {'recipe': 0.0, 'reason': 'why'}}),
     r"deviation 'smoothing' gives the paper's own value 0.0; remove it"),
    (lambda d: d['recipes']['vit-sam/imagenet/x.yaml'].update(
        deviations={'lr': {'recipe': 0.2, 'reason': 'why'}}), r"deviation 'lr' has no paper value under `values`"),
])
def test_malformed_paper_values_are_one_line_errors(tmp_path, edit, message):
    doc = {'paper': 'vit-sam', 'recipes': {'vit-sam/imagenet/x.yaml': copy.deepcopy(_GOOD_ROW)}}
    (tmp_path / 'vit-sam.yaml').write_text(yaml.safe_dump(doc))
    assert list(load_paper_values(tmp_path)) == ['vit-sam/imagenet/x.yaml']
    edit(doc)
    (tmp_path / 'vit-sam.yaml').write_text(yaml.safe_dump(doc))
    with pytest.raises(RecipeError, match=message):
        load_paper_values(tmp_path)


def test_paper_values_of_an_unknown_paper(tmp_path):
    doc = {'paper': 'mypaper', 'recipes': {'mypaper/imagenet/x.yaml': copy.deepcopy(_GOOD_ROW)}}
    (tmp_path / 'mypaper.yaml').write_text(yaml.safe_dump(doc))
    with pytest.raises(RecipeError, match=r"mypaper.yaml: paper 'mypaper' is not in timm_ext.papers.PAPERS "
                                          r"\(how-do-vits-work, vit-sam, "):
        load_paper_values(tmp_path)


def _every_optimizer():
    import timm.optim

    import timm_ext  # noqa: F401  (the SAM family too)
    return timm.optim.list_optimizers()


@pytest.mark.parametrize('opt', _every_optimizer())
def test_opt_kwargs_check_covers_every_optimizer_of_timms_factory(opt):
    """Each optimizer's own arguments pass; a key none of them has is one line (or, for a class that takes any
    keyword, nothing: there is nothing to check against)."""
    from timm_ext.recipes.checks import opt_kwargs_problems, optimizer_arguments

    takes = optimizer_arguments(opt)
    problems = opt_kwargs_problems(opt, {'no_such_argument': 1})
    if takes is None:
        assert problems == []
        return
    assert opt_kwargs_problems(opt, {name: None for name in takes}) == []
    assert len(problems) == 1 and problems[0].startswith(
        f"opt_kwargs key 'no_such_argument' is not an argument of the optimizer timm builds for opt {opt!r}")
