"""docs/integrations.md: every runnable snippet (a ```python block not marked ``# fragment:``, as tests/test_docs.py
defines it) runs as written, with the real framework, and every framework's section has one."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / 'docs' / 'integrations.md'
# section heading -> the package its snippet needs
SECTIONS = {
    'FSDP2': 'torch.distributed.fsdp',
    'PyTorch Lightning': 'lightning',
    'Hugging Face Accelerate': 'accelerate',
    'Hugging Face Trainer': 'transformers',
    'torch.compile': 'torch',
}


def runnable_snippets():
    """(section, code) for every ```python block but the fragments, the section being the ## heading above it."""
    out, section = [], None
    for part in re.split(r'(^## [^\n]*$|^```python\n.*?^```$)', DOC.read_text(), flags=re.M | re.S):
        if part.startswith('## '):
            section = part[3:].strip()
        elif part.startswith('```python') and not part[len('```python\n'):].startswith('# fragment:'):
            out.append((section, part[len('```python\n'):-3]))
    return out


def _needs(section):
    return next(module for key, module in SECTIONS.items() if section.startswith(key))


def test_every_framework_has_a_runnable_snippet():
    sections = [section for section, _ in runnable_snippets()]
    assert all(any(s.startswith(key) for s in sections) for key in SECTIONS), sections


@pytest.mark.slow
@pytest.mark.parametrize('index', range(len(runnable_snippets())))
def test_snippet_runs_as_written(index, tmp_path):
    section, code = runnable_snippets()[index]
    module = _needs(section)
    if importlib.util.find_spec(module.split('.')[0]) is None:
        pytest.skip(f'{module} is not installed (pip install -e ".[test]" installs the frameworks)')
    script = tmp_path / 'snippet.py'
    script.write_text(code)
    env = dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1', PYTHONPATH=str(ROOT))
    if code.startswith('# train_fsdp2.py'):  # launched as the text says: torchrun, 2 processes
        command = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2', str(script)]
    else:
        command = [sys.executable, str(script)]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f'{section} snippet failed:\n{proc.stderr[-3000:]}'
