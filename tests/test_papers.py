"""``timm_ext.papers`` is the one source: model cfgs, catalog families, cards and paper_values agree with it."""
from pathlib import Path

import pytest
import timm
import yaml
from timm.models import model_entrypoint

import timm_ext  # noqa: F401
from timm_ext.catalog import FAMILIES, list_timm_ext_models
from timm_ext.papers import PAPERS, paper_cfg

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)

PAPER_VALUES = Path(timm_ext.__file__).parent / '_data' / 'paper_values'  # read by timm_ext.recipes


def test_cite_forms_and_bibtex():
    paper = PAPERS['scaled-relu']
    assert paper.cite == 'Wang et al., Scaled ReLU Matters for Training Vision Transformers, AAAI 2022'
    assert paper.short_cite == 'Wang et al., AAAI 2022'
    assert paper_cfg('scaled-relu') == {'paper_ids': 'arXiv:2109.03810',
                                        'paper_name': 'Scaled ReLU Matters for Training Vision Transformers'}
    assert paper.bibtex.splitlines()[:2] == ['@inproceedings{wang2022scaled,',
                                             '  title={Scaled {ReLU} Matters for Training Vision Transformers},']
    assert paper.bibtex.endswith('  year={2022}\n}')


@pytest.mark.parametrize('name', list_timm_ext_models())
def test_every_model_cfg_names_its_familys_paper(name):
    family = FAMILIES[model_entrypoint(name).__module__]
    cfg = timm.models.get_pretrained_cfg(name)
    assert (cfg.paper_ids, cfg.paper_name) == (family.source.paper_id, family.source.title)


@pytest.mark.parametrize('slug', list(PAPERS))
def test_paper_values_files_name_the_same_paper(slug):
    """The paper-values file names its paper by slug only; its rows take the title from PAPERS."""
    from timm_ext.recipes import load_paper_values

    data = yaml.safe_load((PAPER_VALUES / f'{slug}.yaml').read_text())
    assert data['paper'] == slug and 'title' not in data
    titles = {row.title for row in load_paper_values().values() if row.paper == slug}
    assert titles == {PAPERS[slug].title}
