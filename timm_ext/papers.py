"""The papers timm-ext implements, once: title, authors, venue, arXiv id and BibTeX of each.

Everything that names a paper derives from :data:`PAPERS`: the models' ``pretrained_cfg`` (``paper_ids``,
``paper_name``), the model families of :mod:`timm_ext.catalog`, and the model cards of :mod:`timm_ext.hub`.
The keys are the recipe slugs (``recipes/<slug>/...``, ``_data/paper_values/<slug>.yaml``).
"""
import re
from dataclasses import dataclass
from typing import Dict

__all__ = ['PAPERS', 'Paper', 'paper_cfg']


@dataclass(frozen=True)
class Paper:
    title: str
    short_authors: str  # as cited in text: 'Park & Kim', 'Chen et al.'
    authors: str  # BibTeX's author field: 'Park, Namuk and Kim, Songkuk'
    booktitle: str
    venue: str  # 'ICLR 2022'
    arxiv: str  # '2202.06709'
    bibtex_key: str

    @property
    def cite(self) -> str:
        """``Park & Kim, How Do Vision Transformers Work?, ICLR 2022``."""
        return f'{self.short_authors}, {self.title}, {self.venue}'

    @property
    def short_cite(self) -> str:
        """``Park & Kim, ICLR 2022``."""
        return f'{self.short_authors}, {self.venue}'

    @property
    def paper_id(self) -> str:
        """timm's ``pretrained_cfg['paper_ids']`` form: ``arXiv:2202.06709``."""
        return f'arXiv:{self.arxiv}'

    @property
    def bibtex(self) -> str:
        """An ``@inproceedings`` entry; words with inner capitals (ResNets, ReLU) are braced to keep their case."""
        title = re.sub(r'\b(\w+[A-Z]\w*)', lambda m: f'{{{m[1]}}}' if m[1][1:] != m[1][1:].lower() else m[1],
                       self.title)
        year = self.venue.rsplit(' ', 1)[-1]
        return (f'@inproceedings{{{self.bibtex_key},\n  title={{{title}}},\n  author={{{self.authors}}},\n'
                f'  booktitle={{{self.booktitle}}},\n  year={{{year}}}\n}}')


_ICLR = 'International Conference on Learning Representations'

# slug: Paper(title, short_authors, authors, booktitle, venue, arxiv, bibtex_key)
PAPERS: Dict[str, Paper] = {
    'how-do-vits-work': Paper('How Do Vision Transformers Work?', 'Park & Kim', 'Park, Namuk and Kim, Songkuk',
                              _ICLR, 'ICLR 2022', '2202.06709', 'park2022how'),
    'vit-sam': Paper('When Vision Transformers Outperform ResNets without Pretraining or Strong Data Augmentations',
                     'Chen et al.', 'Chen, Xiangning and Hsieh, Cho-Jui and Gong, Boqing', _ICLR, 'ICLR 2022',
                     '2106.01548', 'chen2022when'),
    'context-broadcasting': Paper(
        'Scratching Visual Transformer\'s Back with Uniform Attention', 'Hyeon-Woo et al.',
        'Hyeon-Woo, Nam and Yu-Ji, Kim and Heo, Byeongho and Han, Dongyoon and Oh, Seong Joon and Oh, Tae-Hyun',
        'Proceedings of the IEEE/CVF International Conference on Computer Vision (ICCV)', 'ICCV 2023', '2210.08457',
        'hyeonwoo2023scratching'),
    'scaled-relu': Paper(
        'Scaled ReLU Matters for Training Vision Transformers', 'Wang et al.',
        'Wang, Pichao and Wang, Xue and Luo, Hao and Zhou, Jingkai and Zhou, Zhipeng and Wang, Fan and Li, Hao and '
        'Jin, Rong', 'Proceedings of the AAAI Conference on Artificial Intelligence', 'AAAI 2022', '2109.03810',
        'wang2022scaled'),
}

def paper_cfg(slug: str) -> Dict[str, str]:
    """The ``pretrained_cfg`` entries that name the paper ``slug`` (``paper_ids``, ``paper_name``)."""
    paper = PAPERS[slug]
    return {'paper_ids': paper.paper_id, 'paper_name': paper.title}
