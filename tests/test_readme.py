"""README.md is the front door: its Python snippets must run as written and its links must resolve.

Every ```python block of README.md runs in a fresh namespace of its own child process, offline, on
one CPU thread: a snippet that misses an import (``timm_ext`` included: the children share only
``torch`` and ``timm``, imported once to keep the test fast), uses a removed API or raises fails
here, with its line number and output. The relative links of README.md and docs/*.md (anchors
included) must point at files and headings that exist, and the README's test command, CLI list and
model table must agree with .ci/run, the CLI and the real models.
"""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import timm
import torch
from timm.models import model_entrypoint

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / 'README.md'
DOCS = sorted((ROOT / 'docs').glob('*.md'))
MAX_README_LINES = 260
SNIPPET_TIMEOUT_S = 600

_FENCE = re.compile(r'^\s*(```+|~~~+)\s*([\w+-]*)')
_LINK = re.compile(r'!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
_REF_DEF = re.compile(r'^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$')
_HEADING = re.compile(r'^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$')
_SCHEME = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*:')


def _split_fences(text: str) -> Tuple[List[Tuple[int, str, str]], List[Tuple[int, str]]]:
    """Fenced blocks as (first code line number, language, code) and the other lines as (number, line)."""
    blocks, prose = [], []
    fence, lang, start, code = None, '', 0, []
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if fence is None:
            if match:
                fence, lang, start, code = match.group(1), match.group(2).lower(), number + 1, []
            else:
                prose.append((number, line))
        elif match and match.group(1).startswith(fence) and not match.group(2) and line.strip() == match.group(1):
            blocks.append((start, lang, '\n'.join(code) + '\n'))
            fence = None
        else:
            code.append(line)
    if fence is not None:
        raise AssertionError(f'unclosed code fence opened at line {start - 1}')
    return blocks, prose


def _python_snippets(path: Path) -> List[Tuple[int, str]]:
    blocks, _ = _split_fences(path.read_text(encoding='utf-8'))
    return [(line, code) for line, lang, code in blocks if lang in ('python', 'py')]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # a link keeps its text
    text = re.sub(r'[^\w\- ]', '', text.strip().lower())
    return text.replace(' ', '-')


def _anchors(path: Path) -> List[str]:
    _, prose = _split_fences(path.read_text(encoding='utf-8'))
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
    _, prose = _split_fences(path.read_text(encoding='utf-8'))
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


# Runs in a child process: imports torch and timm once, then forks one grandchild per snippet, which
# runs it in a fresh namespace with its output in a log file, and records the exit code of each.
_RUNNER = r'''
import json, os, sys, traceback
import torch, timm
torch.set_num_threads(1)
snippets, log_prefix, result_path = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
results = []
for index, (line, code) in enumerate(snippets):
    log_path = f"{log_prefix}{index}.log"
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1); os.dup2(fd, 2)
        status = 1
        try:
            exec(compile(code, f"README.md, snippet at line {line}", "exec"), {"__name__": "__main__"})
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    results.append(dict(line=line, returncode=os.waitstatus_to_exitcode(wait_status), log=log_path))
json.dump(results, open(result_path, "w"))
'''


def _snippet_env() -> Dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1', PYTHONHASHSEED='0')


def _run_forked(snippets: List[Tuple[int, str]], folder: Path) -> Dict[int, Tuple[int, str]]:
    spec, result = folder / 'snippets.json', folder / 'results.json'
    spec.write_text(json.dumps(snippets))
    child = subprocess.Popen(
        [sys.executable, '-c', _RUNNER, str(spec), str(folder / 'snippet'), str(result)], cwd=folder,
        env=_snippet_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=SNIPPET_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the runner and the snippet it forked
        child.communicate()
        pytest.fail(f'README snippets took more than {SNIPPET_TIMEOUT_S} s')
    if child.returncode != 0 or not result.exists():
        pytest.fail(f'the README snippet runner failed (exit code {child.returncode}):\n{output}')
    return {r['line']: (r['returncode'], Path(r['log']).read_text(errors='replace'))
            for r in json.loads(result.read_text())}


def _run_each(snippets: List[Tuple[int, str]], folder: Path) -> Dict[int, Tuple[int, str]]:
    results = {}
    for line, code in snippets:
        done = subprocess.run([sys.executable, '-c', code], cwd=folder, env=_snippet_env(), capture_output=True,
                              text=True, timeout=SNIPPET_TIMEOUT_S)
        results[line] = (done.returncode, done.stdout + done.stderr)
    return results


SNIPPETS = _python_snippets(README)


@pytest.fixture(scope='module')
def snippet_results(tmp_path_factory) -> Dict[int, Tuple[int, str]]:
    folder = tmp_path_factory.mktemp('readme_snippets')
    run = _run_forked if hasattr(os, 'fork') else _run_each
    return run(SNIPPETS, folder)


def test_readme_has_python_snippets():
    # a changed fence spelling must not turn the snippet test into a test of nothing
    assert len(SNIPPETS) >= 3, f'expected the README\'s Python snippets, found {len(SNIPPETS)}'


@pytest.mark.slow
@pytest.mark.parametrize('line', [line for line, _ in SNIPPETS], ids=[f'line{line}' for line, _ in SNIPPETS])
def test_readme_snippet_runs(line, snippet_results):
    returncode, output = snippet_results[line]
    assert returncode == 0, f'README.md snippet at line {line} failed (exit code {returncode}):\n{output}'


@pytest.mark.slow
def test_snippet_runner_reports_failures(tmp_path):
    """The runner itself: a snippet without its imports or with an error fails; each gets a fresh namespace."""
    snippets = [(1, 'value = 1\nprint("ok")\n'), (2, 'print(value)\n'), (3, 'timm.create_model("vit_tiny_cb")\n'),
                (4, 'import timm\ntimm.create_model("vit_tiny_cb")\n'), (5, 'raise SystemExit(3)\n')]
    results = _run_forked(snippets, tmp_path) if hasattr(os, 'fork') else _run_each(snippets, tmp_path)
    assert results[1] == (0, 'ok\n')
    assert results[2][0] != 0 and "NameError: name 'value' is not defined" in results[2][1]
    assert results[3][0] != 0 and "NameError: name 'timm' is not defined" in results[3][1]
    assert results[4][0] != 0 and 'Unknown model (vit_tiny_cb)' in results[4][1]  # timm_ext was not imported
    assert results[5][0] == 3


@pytest.mark.parametrize('path', DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_python_snippets_compile(path):
    # docs/ snippets may need files or weights (not run here), but each must at least be valid Python
    for line, code in _python_snippets(path):
        try:
            compile(textwrap.dedent(code), f'{path.name}, snippet at line {line}', 'exec')
        except SyntaxError as e:
            pytest.fail(f'{path.relative_to(ROOT)}: the snippet at line {line} is not valid Python: {e}')


def test_readme_length():
    lines = README.read_text(encoding='utf-8').count('\n')
    assert lines <= MAX_README_LINES, f'README.md has {lines} lines; keep <= {MAX_README_LINES}, move detail to docs/'


def test_readme_has_no_placeholders():
    text = README.read_text(encoding='utf-8')
    for word in ('TBD', 'TODO', 'FIXME'):
        assert word not in text, f'README.md contains the placeholder {word!r}'


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
    assert commands == [ruff, 'python -m pytest tests -q']
    assert f'{ruff}\nHF_HUB_OFFLINE=1 python -m pytest tests -q\n' in readme
    assert 'pip install -e ".[test]"' in readme and 'pip install --quiet -e ".[test]"' in ci


def test_readme_names_every_cli_subcommand():
    from timm_ext.cli import SUBCOMMANDS

    blocks, _ = _split_fences(README.read_text(encoding='utf-8'))
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
