"""Which tests each lane of .ci/run runs, read from the lanes' own pytest command lines.

test_ci_lanes.py checks with it that every test runs in some lane and that docs/compatibility.md lists what each lane
leaves out; both read the scripts CI runs, so neither can drift from them.
"""
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
CI_RUN = ROOT / '.ci' / 'run'
RELEASE_LANE = ROOT / '.ci' / 'lanes' / 'timm_release.sh'
FLOOR_LANE = ROOT / '.ci' / 'lanes' / 'wheel_floor.sh'
_MARK_WORD = re.compile(r'\(|\)|[A-Za-z_][A-Za-z0-9_]*')


@dataclass(frozen=True)
class Lane:
    """A lane's test selection: the paths it names (``('tests',)`` for the whole suite) and its ``-m`` expression."""
    name: str
    paths: Tuple[str, ...]
    marks: Optional[str] = None

    def runs(self, test: str, marks: FrozenSet[str]) -> bool:
        """Whether the lane runs ``test`` (a pytest node id from the repository root) that carries ``marks``."""
        named = any(test == p or test.startswith((p + '::', p + '[', p.rstrip('/') + '/')) for p in self.paths)
        return named and (self.marks is None or mark_expression_holds(self.marks, marks))


def mark_expression_holds(expression: str, marks: FrozenSet[str]) -> bool:
    """pytest's ``-m`` expression (``not``, ``and``, ``or``, parentheses, mark names) for a test with ``marks``."""
    words = _MARK_WORD.findall(expression)
    if ''.join(words) != re.sub(r'\s+', '', expression):
        raise ValueError(f'-m {expression!r}: only not/and/or, parentheses and mark names are read here')
    at = 0

    def joined(operator: str, operand) -> bool:  # a run of operands joined by `or` (or by `and`)
        nonlocal at
        values = [operand()]
        while at < len(words) and words[at] == operator:
            at += 1
            values.append(operand())
        return any(values) if operator == 'or' else all(values)

    def either() -> bool:  # `or` binds last, then `and`, then `not`
        return joined('or', both)

    def both() -> bool:
        return joined('and', single)

    def single() -> bool:
        nonlocal at
        word, at = words[at], at + 1
        if word == 'not':
            return not single()
        if word == '(':
            value = either()
            at += 1  # the ')'
            return value
        return word in marks

    return either()


def _pytest_line(text: str, where: Path) -> str:
    lines = [ln for ln in re.sub(r'\\\n\s*', ' ', text).splitlines() if re.search(r'(-m pytest|/pytest") ', ln)]
    if len(lines) != 1:
        raise ValueError(f'{where.relative_to(ROOT)}: expected one pytest command line, found {len(lines)}')
    return lines[0]


def _marks_option(line: str) -> Optional[str]:
    found = re.search(r' -m "([^"]+)"', line)
    return found.group(1) if found else None


def release_versions() -> List[str]:
    """The timm releases .ci/run gives a lane of their own (its ``for version in ...`` loop)."""
    found = re.search(r'^for version in ([0-9. ]+); do$', CI_RUN.read_text(), re.M)
    if not found:
        raise ValueError('.ci/run: no `for version in ...; do` loop over the release lanes')
    return found.group(1).split()


def lanes() -> List[Lane]:
    """Every lane of .ci/run that runs the project's tests, as its script runs them."""
    newest = _pytest_line(CI_RUN.read_text(), CI_RUN)
    release = _pytest_line(RELEASE_LANE.read_text(), RELEASE_LANE)
    floor = _pytest_line(FLOOR_LANE.read_text(), FLOOR_LANE)
    return [Lane('newest', ('tests',), _marks_option(newest)),
            *(Lane(f'timm {v}', ('tests',), _marks_option(release)) for v in release_versions()),
            Lane('floor', tuple(re.findall(r'"\$repo/(tests/[^"]+)"', floor)), _marks_option(floor))]


def left_out(lane: Lane, marks_by_test: Dict[str, FrozenSet[str]],
             every: Sequence[Lane]) -> Dict[str, Tuple[int, int, Tuple[str, ...], Tuple[str, ...]]]:
    """Per test module, the tests ``lane`` leaves out: (how many, of how many there, the lanes that run them, the
    marks of its ``-m`` expression they carry)."""
    named = set(_MARK_WORD.findall(lane.marks or '')) - {'not', 'and', 'or', '(', ')'}
    out: Dict[str, List] = {}
    for test, marks in marks_by_test.items():
        entry = out.setdefault(test.split('::')[0], [0, 0, set(), set()])
        entry[1] += 1
        if not lane.runs(test, marks):
            entry[0] += 1
            entry[2].update(o.name for o in every if o is not lane and o.runs(test, marks))
            entry[3].update(marks & named)
    return {m: (n, total, tuple(sorted(others)), tuple(sorted(why)))
            for m, (n, total, others, why) in sorted(out.items()) if n}
