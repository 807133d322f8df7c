"""Markdown as the doc tests read it: fenced code blocks and the prose around them (tests/test_readme.py,
tests/test_docs.py)."""
import re
from typing import List, Tuple

_FENCE = re.compile(r'^\s*(```+|~~~+)\s*([\w+-]*)')


def split_fences(text: str) -> Tuple[List[Tuple[int, str, str]], List[Tuple[int, str]]]:
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
