"""The model card (``README.md``) of an exported hub folder: Hugging Face YAML front matter, then the paper,
the recipe and its table row, the measured top-1, how to load it (``import timm_ext`` first), how it was
trained, the licence and the citations."""
import csv
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from timm_ext.papers import PAPERS, Paper

__all__ = ['CardInfo', 'PAPERS', 'model_card']

_TIMM_BIBTEX = ('@misc{rw2019timm,\n  author={Ross Wightman},\n  title={PyTorch Image Models},\n  year={2019},\n'
                '  publisher={GitHub},\n  howpublished={\\url{https://github.com/huggingface/pytorch-image-models}},\n'
                '  doi={10.5281/zenodo.4414861}\n}')
_DATASETS = {'imagenet': 'imagenet-1k', 'cifar10': 'cifar10', 'cifar100': 'cifar100'}
# the train.py settings worth showing on a card, in this order
_TRAIN_KEYS = ('model', 'num_classes', 'model_kwargs', 'img_size', 'input_size', 'epochs', 'batch_size',
               'grad_accum_steps', 'opt', 'opt_kwargs', 'lr', 'lr_base', 'lr_base_size', 'weight_decay', 'sched',
               'warmup_epochs', 'smoothing', 'mixup', 'cutmix', 'aa', 'reprob', 'drop_path', 'model_ema',
               'model_ema_decay', 'amp', 'seed')


@dataclass
class CardInfo:
    """What the card says beyond the config: recipe, measured top-1, how it was trained, where it lives."""
    recipe: Optional[str] = None
    top1: Optional[float] = None
    train_command: Optional[str] = None
    train_args: Optional[Dict[str, Any]] = None
    repo_id: Optional[str] = None
    license: str = 'apache-2.0'
    dataset: Optional[str] = None
    ema: bool = False
    epoch: Optional[int] = None


def model_card(config: Dict[str, Any], info: CardInfo, num_params: Optional[int] = None) -> str:
    """The README.md text for a folder whose config.json is ``config``."""
    from timm_ext.load_errors import HubError

    if info.top1 is not None and not 0.0 <= float(info.top1) <= 100.0:
        raise HubError(f'top1={info.top1} must be a percentage between 0 and 100')
    arch = config['architecture']
    recipe = _recipe(info.recipe) if info.recipe else None
    papers = _papers(arch, recipe)
    dataset = info.dataset or (recipe or {}).get('dataset') or None
    tags = ['image-classification', 'timm', 'timm-ext'] + list(papers)
    front = ['---', 'library_name: timm', f'license: {info.license}', 'pipeline_tag: image-classification', 'tags:']
    front += [f'- {t}' for t in tags]
    if dataset:
        front += ['datasets:', f'- {_DATASETS.get(dataset, dataset)}']
    front.append('---')
    name = info.repo_id.split('/')[-1] if info.repo_id else arch
    lines = front + ['', f'# Model card for {name}', '', _summary(arch, papers, dataset), '']
    lines += ['## Model details', ''] + _details(config, info, recipe, papers, dataset, num_params) + ['']
    lines += ['## Usage', '', '```python'] + _usage(info.repo_id) + ['```', '']
    lines += ['## Training', ''] + _training(info, recipe) + ['']
    lines += ['## License', '', f'The weights: `{info.license}`. timm-ext and timm (the code): Apache-2.0.', '']
    lines += ['## Citation', '']
    for paper in papers.values():
        lines += ['```bibtex', paper.bibtex, '```', '']
    lines += ['```bibtex', _TIMM_BIBTEX, '```', '']
    return '\n'.join(lines)


def _recipe(name: str) -> Dict[str, Any]:
    """The recipe's file, header comment and recipes/index.csv row (paper, table, row, expected top-1)."""
    from timm_ext.load_errors import HubError
    from timm_ext.recipes import RecipeError, find_recipe, recipes_dir
    try:
        path = find_recipe(name)
    except RecipeError as e:
        raise HubError(str(e)) from None
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith('#'):
            break
        header.append(line[1:].strip())
    key = name[:-len('.yaml')] if name.endswith('.yaml') else name
    info: Dict[str, Any] = {'name': key, 'header': '\n'.join(header).strip()}
    index = recipes_dir() / 'index.csv'
    if index.is_file():
        with index.open(newline='') as f:
            for row in csv.DictReader(f):
                if (row.get('recipe') or '').removesuffix('.yaml') == key:
                    info.update({k: v for k, v in row.items() if k != 'recipe' and v})
                    break
    return info


def _papers(arch: str, recipe: Optional[Dict[str, Any]]) -> Dict[str, Paper]:
    """The papers the card cites, by slug: the architecture's family, then the recipe's paper."""
    from timm.models import get_arch_name, is_model, model_entrypoint

    from timm_ext.catalog import FAMILIES

    papers: Dict[str, Paper] = {}
    base = get_arch_name(arch)
    family = FAMILIES.get(model_entrypoint(base).__module__) if is_model(base) else None
    if family is not None and family.slug:
        papers[family.slug] = PAPERS[family.slug]
    slug = (recipe or {}).get('paper')
    if slug in PAPERS:
        papers.setdefault(slug, PAPERS[slug])
    return papers


def _summary(arch: str, papers: Dict[str, Paper], dataset: Optional[str]) -> str:
    text = f'`{arch}` image classifier'
    if dataset:
        text += f' trained on {dataset}'
    text += ' with timm\'s train.py and timm-ext (`pip install timm-ext`)'
    if papers:
        text += ', from ' + '; '.join(f'{p.cite} ([arXiv:{p.arxiv}](https://arxiv.org/abs/{p.arxiv}))'
                                     for p in papers.values())
    return text + '.'


def _details(config: Dict[str, Any], info: CardInfo, recipe: Optional[Dict[str, Any]], papers: Dict[str, Paper],
             dataset: Optional[str], num_params: Optional[int]) -> List[str]:
    cfg = config['pretrained_cfg']
    rows = [f'- **Architecture:** `{config["architecture"]}` with `model_args` '
            f'`{json.dumps(config["model_args"], sort_keys=True)}`']
    if num_params is not None:
        rows.append(f'- **Parameters (M):** {num_params / 1e6:.2f}')
    rows.append(f'- **Classes:** {config["num_classes"]}')
    if cfg.get('input_size'):
        rows.append(f'- **Image size:** {" x ".join(map(str, cfg["input_size"]))}')
    if cfg.get('mean') and cfg.get('std'):
        rows.append(f'- **Normalisation:** mean {list(cfg["mean"])}, std {list(cfg["std"])}')
    if dataset:
        rows.append(f'- **Dataset:** {dataset}')
    for paper in papers.values():
        rows.append(f'- **Paper:** {paper.cite}, https://arxiv.org/abs/{paper.arxiv}')
    if recipe:
        where = ', '.join(recipe[k] for k in ('table', 'row') if recipe.get(k))  # 'Table 5, ViT-Ti + CB'
        rows.append(f'- **Recipe:** `{recipe["name"]}`' + (f' ({where})' if where else ''))
        if recipe.get('expected_top1'):
            rows.append(f'- **Paper\'s top-1 for this row (%):** {recipe["expected_top1"]}')
    measured = f'{float(info.top1):.2f}' if info.top1 is not None else 'not measured'
    rows.append(f'- **Top-1 measured for these weights (%):** {measured}')
    weights = 'EMA weights (train.py --model-ema)' if info.ema else 'model weights'
    if info.epoch is not None:
        weights += f' after epoch {info.epoch}'
    rows.append(f'- **Weights:** {weights}')
    return rows


def _usage(repo_id: Optional[str]) -> List[str]:
    name = f'hf-hub:{repo_id}' if repo_id else 'hf-hub:ORG/NAME'
    return [
        'import timm',
        'import timm_ext  # registers the timm-ext architectures: required before timm.create_model',
        '',
        f'model = timm.create_model({name!r}, pretrained=True).eval()',
        'data_config = timm.data.resolve_data_config(model=model)',
        'transform = timm.data.create_transform(**data_config, is_training=False)',
    ]


def _training(info: CardInfo, recipe: Optional[Dict[str, Any]]) -> List[str]:
    command = info.train_command or (f'timm-ext train -c {recipe["name"]} --data-dir /path/to/data' if recipe
                                     else None)
    lines = []
    if command:
        lines += ['```bash', command, '```', '']
    else:
        lines += ['The training command was not recorded.', '']
    if recipe and recipe.get('header'):
        lines += [f'The recipe `{recipe["name"]}`:', '', '```text', recipe['header'], '```', '']
    args = info.train_args or {}
    shown = [(k, args[k]) for k in _TRAIN_KEYS if args.get(k) not in (None, '', [], {})]
    if shown:
        lines += ['train.py settings recorded in the checkpoint:', '', '| argument | value |', '|---|---|']
        lines += [f'| `{k}` | `{v}` |' for k, v in shown]
    return lines

