"""README.md is the front door: its links must resolve and what it states must hold.

The relative links of README.md and docs/**/*.md (anchors included) must point at files and headings that exist,
and the README's test command, CLI list and model table must agree with .ci/run, the CLI and the real models. Its
Python blocks, and those of docs/, run in tests/test_docs.py.
"""
import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import timm
import torch
from _markdown import split_fences
from timm.models import model_entrypoint

pytestmark = pytest.mark.timm_models_only  # calls timm only in its models: not in the release lanes (_timm_free.py)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / 'README.md'
DOCS = sorted((ROOT / 'docs').rglob('*.md'))
MAX_README_LINES = 260

_LINK = re.compile(r'!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
_REF_DEF = re.compile(r'^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$')
_HEADING = re.compile(r'^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$')
_SCHEME = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*:')


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # a link keeps its text
    text = re.sub(r'[^\w\- ]', '', text.strip().lower())
    return text.replace(' ', '-')


def _anchors(path: Path) -> List[str]:
    _, prose = split_fences(path.read_text(encoding='utf-8'))
    seen: Dict[str, int] = {}
    anchors = []
    for _, line in prose:
        match = _HEADING.match(line)
        if not match:
            continue
        slug = _slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.append(slug if count == 0 else f'{slug}-{count}')
    return anchors


def _links(path: Path) -> List[Tuple[int, str]]:
    """Every link target of a Markdown file outside code blocks and inline code, with its line number."""
    _, prose = split_fences(path.read_text(encoding='utf-8'))
    links = []
    for number, line in prose:
        line = re.sub(r'(`+)(?:(?!\1).)+\1', '', line)  # inline code
        links += [(number, m.group(1)) for m in _LINK.finditer(line)]
        ref = _REF_DEF.match(line)
        if ref:
            links.append((number, ref.group(1)))
    return links


def _broken_links(path: Path) -> List[str]:
    problems = []
    for number, target in _links(path):
        if _SCHEME.match(target):
            continue  # a web address
        file_part, _, anchor = target.partition('#')
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f'{path.relative_to(ROOT)}:{number}: {target}'
        if not dest.is_relative_to(ROOT):
            problems.append(f'{where} leaves the repository')
        elif not dest.exists():
            problems.append(f'{where}: {dest.relative_to(ROOT)} does not exist')
        elif anchor and dest.suffix == '.md' and anchor not in _anchors(dest):
            problems.append(f'{where}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}')
    return problems


@pytest.mark.parametrize('path', [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert not _broken_links(path), '\n'.join(_broken_links(path))


def test_link_checker_finds_broken_links(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], 'ROOT', tmp_path)
    (tmp_path / 'other.md').write_text('# Other page\n\n## A `code` heading!\n\n## Twice\n\n## Twice\n')
    page = tmp_path / 'page.md'
    page.write_text(
        '[ok](other.md) [ok](other.md#a-code-heading) [ok](other.md#twice-1) [ok](#page) [web](https://x.org/y)\n'
        '# Page\n`[code](missing_in_code.md)`\n```text\n[fenced](missing_in_fence.md)\n```\n'
        '[gone](missing.md) [bad anchor](other.md#nope) [up](../outside.md)\n[ref]: missing_ref.md\n')
    problems = _broken_links(page)
    assert [p.split(': ')[1] for p in problems] == [
        'missing.md', 'other.md#nope', '../outside.md leaves the repository', 'missing_ref.md']


def test_readme_test_command_is_what_ci_runs():
    readme = README.read_text(encoding='utf-8')
    ci = (ROOT / '.ci' / 'run').read_text()
    assert 'export HF_HUB_OFFLINE=1' in ci
    commands = [line.strip() for line in ci.splitlines() if line.strip().startswith(('ruff ', 'python -m pytest'))]
    ruff = 'ruff check timm_ext timm_ext_cli tests benchmarks reproduction .ci'
    assert commands == [ruff, 'python -m pytest tests -q -n auto']
    assert f'{ruff}\nHF_HUB_OFFLINE=1 python -m pytest tests -q -n auto\n' in readme
    assert 'pip install -e ".[test]"' in readme and 'pip install --quiet -e ".[test]"' in ci


def test_readme_names_every_cli_subcommand():
    from timm_ext.cli import SUBCOMMANDS

    blocks, _ = split_fences(README.read_text(encoding='utf-8'))
    cli = [code for _, lang, code in blocks if lang == 'text' and code.startswith('timm-ext ')]
    assert len(cli) == 1, 'README.md should show the command line in one ```text block of timm-ext lines'
    missing = [name for name in SUBCOMMANDS if not re.search(rf'(^timm-ext |\| ){name}\b', cli[0], flags=re.M)]
    assert not missing, f'the README\'s command-line block does not show the subcommands {missing}'


def _timm_ext_models() -> List[str]:
    return [n for n in timm.list_models() if model_entrypoint(n).__module__.startswith('timm_ext.')]


def test_readme_model_table_matches_the_models():
    import timm_ext  # noqa: F401

    readme = README.read_text(encoding='utf-8')
    count = re.search(r'registers (\d+) models', readme)
    assert count and int(count.group(1)) == len(_timm_ext_models())
    rows = re.findall(r'^\| `(\w+)` \| [^|]+ \| ([\d.]+)M \|', readme, flags=re.M)
    assert len(rows) >= 10
    for name, params_m in rows:
        with torch.device('meta'):  # shapes only: no memory, no init
            model = timm.create_model(name)
        params = sum(p.numel() for p in model.parameters())
        assert f'{params / 1e6:.2f}' == params_m, f'{name}: README says {params_m}M, the model has {params:,}'
