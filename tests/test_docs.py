"""Every Python block of README.md and docs/**/*.md runs in the suite as written, or is marked as a fragment.

A Python block is a ```python (or ```py) fence. A **fragment** is a block whose first line is the comment
``# fragment: <what it needs>``, e.g. ``# fragment: model, x, y, loss_fn and a SAM optimizer are yours``: the
reader sees the marker and its reason, and the block is only compiled here. Mark a block a fragment when it needs
what only the reader has (their model and data, a checkpoint, the network) or takes minutes; else it runs.

Every other block runs here, as written: each in a fresh namespace of its own forked child (the runner imports
``torch`` and ``timm`` once, to keep this fast; ``timm_ext`` is the block's to import), in a temporary folder,
offline, on one CPU thread. A block that misses an import, uses a removed API or raises fails with its page, line
and output. docs/integrations.md's blocks need their frameworks (one runs under torchrun), so
tests/test_docs_integrations.py runs them; this module checks that it does, and runs none twice.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

import pytest
from _markdown import split_fences
from test_docs_integrations import DOC as INTEGRATIONS
from test_docs_integrations import runnable_snippets as integration_snippets

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / 'README.md', *sorted((ROOT / 'docs').rglob('*.md'))]
FRAGMENT = '# fragment:'
RUN_TIMEOUT_S = 600
MIN_BLOCKS, MIN_RUN_HERE = 30, 10  # a changed fence spelling must not make these tests test nothing


class Block(NamedTuple):
    page: str  # relative to the repository root
    line: int  # of the block's first code line
    code: str  # dedented (a block inside a list item is indented in the page)

    @property
    def label(self) -> str:
        return f'{self.page}:{self.line}'

    @property
    def fragment(self) -> Optional[str]:
        """The reason after ``# fragment:`` on the first line, or None for a block that runs."""
        first = self.code.lstrip('\n').split('\n', 1)[0]
        return first[len(FRAGMENT):].strip() if first.startswith(FRAGMENT) else None


def python_blocks(path: Path) -> List[Block]:
    blocks, _ = split_fences(path.read_text(encoding='utf-8'))
    return [Block(str(path.relative_to(ROOT)), line, textwrap.dedent(code))
            for line, lang, code in blocks if lang in ('python', 'py', 'python3')]


def _run_elsewhere(block: Block) -> Optional[str]:
    """The test module that runs ``block`` as written, if not this one."""
    if block.page == str(INTEGRATIONS.relative_to(ROOT)):
        if block.code.strip() in {code.strip() for _, code in integration_snippets()}:
            return 'tests/test_docs_integrations.py'
    return None


BLOCKS = [block for page in PAGES for block in python_blocks(page)]
FRAGMENTS = [block for block in BLOCKS if block.fragment is not None]
ELSEWHERE = [block for block in BLOCKS if block.fragment is None and _run_elsewhere(block)]
RUN_HERE = [block for block in BLOCKS if block.fragment is None and not _run_elsewhere(block)]


def test_every_python_block_runs_or_is_a_fragment():
    counts = f'{len(BLOCKS)} blocks: {len(RUN_HERE)} run here, {len(ELSEWHERE)} elsewhere, {len(FRAGMENTS)} fragments'
    assert len(BLOCKS) >= MIN_BLOCKS and len(RUN_HERE) >= MIN_RUN_HERE, counts
    assert len(RUN_HERE) + len(ELSEWHERE) + len(FRAGMENTS) == len(BLOCKS), counts
    assert {b.page for b in RUN_HERE} >= {'README.md', 'docs/sam.md'}, counts
    unexplained = [b.label for b in FRAGMENTS if not b.fragment]
    assert not unexplained, f'these fragments do not say what they need after "{FRAGMENT}": {unexplained}'
    misplaced = [b.label for b in BLOCKS if b.fragment is None and FRAGMENT in b.code]
    assert not misplaced, f'"{FRAGMENT}" marks a fragment only as the block\'s first line: {misplaced}'


def test_integrations_runs_every_block_it_does_not_mark():
    """test_docs_integrations.py and this module agree on what a fragment is: none of its pages' blocks is lost."""
    page = [b for b in BLOCKS if b.page == str(INTEGRATIONS.relative_to(ROOT))]
    assert [b for b in page if b.fragment is None] == [b for b in ELSEWHERE if b.page == page[0].page]
    assert len(integration_snippets()) == len([b for b in page if b.fragment is None])


@pytest.mark.parametrize('block', FRAGMENTS, ids=[b.label for b in FRAGMENTS])
def test_fragment_is_valid_python(block):
    try:
        compile(block.code, block.label, 'exec')
    except SyntaxError as e:
        pytest.fail(f'{block.label}: the fragment is not valid Python: {e}')


# Runs in a child process: imports torch and timm once, then forks one grandchild per block, which runs it in a
# fresh namespace with its output in a log file, and records the exit code of each.
_RUNNER = r'''
import json, os, sys, traceback
import torch, timm
torch.set_num_threads(1)
blocks, log_prefix, result_path = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
results = []
for index, (label, code) in enumerate(blocks):
    log_path = f"{log_prefix}{index}.log"
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1); os.dup2(fd, 2)
        status = 1
        try:
            exec(compile(code, label, "exec"), {"__name__": "__main__"})
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(status)
    _, wait_status = os.waitpid(pid, 0)
    results.append(dict(label=label, returncode=os.waitstatus_to_exitcode(wait_status), log=log_path))
json.dump(results, open(result_path, "w"))
'''


def _block_env() -> Dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1', PYTHONHASHSEED='0')


def _run_forked(blocks: List[Tuple[str, str]], folder: Path) -> Dict[str, Tuple[int, str]]:
    """``(label, code)`` pairs run by the runner above: label -> (exit code, output)."""
    spec, result = folder / 'blocks.json', folder / 'results.json'
    spec.write_text(json.dumps(blocks))
    child = subprocess.Popen(
        [sys.executable, '-c', _RUNNER, str(spec), str(folder / 'block'), str(result)], cwd=folder,
        env=_block_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)  # the runner and the block it forked
        child.communicate()
        pytest.fail(f'the docs\' Python blocks took more than {RUN_TIMEOUT_S} s')
    if child.returncode != 0 or not result.exists():
        pytest.fail(f'the block runner failed (exit code {child.returncode}):\n{output}')
    return {r['label']: (r['returncode'], Path(r['log']).read_text(errors='replace'))
            for r in json.loads(result.read_text())}


def _run_each(blocks: List[Tuple[str, str]], folder: Path) -> Dict[str, Tuple[int, str]]:
    """The same without fork (Windows): one interpreter per block."""
    results = {}
    for label, code in blocks:
        done = subprocess.run([sys.executable, '-c', code], cwd=folder, env=_block_env(), capture_output=True,
                              text=True, timeout=RUN_TIMEOUT_S)
        results[label] = (done.returncode, done.stdout + done.stderr)
    return results


def _run(blocks: List[Tuple[str, str]], folder: Path) -> Dict[str, Tuple[int, str]]:
    return _run_forked(blocks, folder) if hasattr(os, 'fork') else _run_each(blocks, folder)


# the runner's own check, run with the docs' blocks (one runner start): a block without its imports or with an error
# fails, and each block gets a fresh namespace
_RUNNER_CHECKS = [('check:ok', 'value = 1\nprint("ok")\n'), ('check:fresh', 'print(value)\n'),
                  ('check:no-import', 'timm.create_model("vit_tiny_cb")\n'),
                  ('check:no-timm-ext', 'import timm\ntimm.create_model("vit_tiny_cb")\n'),
                  ('check:exit', 'raise SystemExit(3)\n')]


@pytest.fixture(scope='module')
def block_results(tmp_path_factory) -> Dict[str, Tuple[int, str]]:
    blocks = [*_RUNNER_CHECKS[:2], *[(b.label, b.code) for b in RUN_HERE], *_RUNNER_CHECKS[2:]]
    return _run(blocks, tmp_path_factory.mktemp('doc_blocks'))


@pytest.mark.slow
@pytest.mark.parametrize('label', [b.label for b in RUN_HERE])
def test_block_runs_as_written(label, block_results):
    returncode, output = block_results[label]
    assert returncode == 0, f'the Python block at {label} failed (exit code {returncode}):\n{output}'


@pytest.mark.slow
def test_block_runner_reports_failures(block_results):
    """The runner itself, on the checks it ran beside the docs' blocks."""
    results = {label[len('check:'):]: result for label, result in block_results.items() if label.startswith('check:')}
    assert results['ok'] == (0, 'ok\n')
    assert results['fresh'][0] != 0 and "NameError: name 'value' is not defined" in results['fresh'][1]
    assert results['no-import'][0] != 0 and "NameError: name 'timm' is not defined" in results['no-import'][1]
    # the blocks before it imported timm_ext, each in its own child: this one never did
    assert results['no-timm-ext'][0] != 0 and 'Unknown model (vit_tiny_cb)' in results['no-timm-ext'][1]
    assert results['exit'][0] == 3


def test_fragment_marker_is_the_first_line_only():
    assert Block('x.md', 1, '# fragment: your model\nmodel(x)\n').fragment == 'your model'
    assert Block('x.md', 1, 'import timm\n# fragment: too late\n').fragment is None
    assert Block('x.md', 1, '# fragment:\nx\n').fragment == ''  # marked, but says nothing: refused above
