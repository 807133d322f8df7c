""".ci/run's lanes: every test runs in some lane, docs/compatibility.md lists what each lane leaves out, and a test
marked ``timm_free`` that calls timm, or ``timm_models_only`` that calls a release-bound part, fails
(tests/_timm_free.py)."""
import ast
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from _lanes import ROOT, Lane, lanes, left_out, mark_expression_holds
from _timm_free import MARK, MODELS_MARK, TimmCallWatch

COMPATIBILITY = ROOT / 'docs' / 'compatibility.md'
BEGIN, END = '<!-- lanes: begin -->', '<!-- lanes: end -->'
# what ties a test to the timm release without a call the watch would see: timm's scripts of that release (train.py,
# validate.py), what differs by version (timm.__version__, the compat and backport modules), timm's task and
# optimizer-registry internals
VERSION_BOUND = re.compile(r'_timm_train|TRAIN_PY|VALIDATE_PY|train\.py|validate\.py|timm_scripts|require_timm_script|'
                           r'timm\.__version__|_timm_compat|_timm_backports|timm\.task|default_registry|_optim_factory')


def _whole_suite(config) -> bool:
    """Whether this pytest collected the whole suite: tests/ (or nothing) named, no -m, -k or --deselect."""
    named = [Path(a.split('::')[0]).resolve() for a in config.args] or [ROOT / 'tests']
    option = config.option
    return named == [ROOT / 'tests'] and not (option.markexpr or option.keyword or option.deselect)


@pytest.fixture(scope='module')
def collected(request):
    """Every test of the suite and its marks: as this pytest collected them when it collected the whole suite (each
    pytest-xdist worker collects all of it, as .ci/run's newest lane runs it), else from a child pytest
    (--collect-only)."""
    if _whole_suite(request.config):
        return {item.nodeid: frozenset(m.name for m in item.iter_markers()) for item in request.session.items}
    path = request.getfixturevalue('tmp_path_factory').mktemp('marks') / 'marks.jsonl'
    env = dict(os.environ, TIMM_EXT_COLLECTED_MARKS=str(path), PYTEST_ADDOPTS='')
    env.pop('PYTEST_XDIST_WORKER', None)
    done = subprocess.run([sys.executable, '-m', 'pytest', 'tests', '--collect-only', '-q', '-p', 'no:cacheprovider'],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return {r['test']: frozenset(r['marks']) for r in rows}


@pytest.mark.parametrize('expression, marks, holds', [
    ('not slow and not timm_free', set(), True),
    ('not slow and not timm_free', {'timm_free'}, False),
    ('not (slow or timm_free)', {'slow'}, False),
    ('slow or cuda and not timm_free', {'slow', 'timm_free'}, True),  # and binds first, as in pytest
    ('not not slow', {'slow'}, True),
])
def test_mark_expressions_read_as_pytest_reads_them(expression, marks, holds):
    assert mark_expression_holds(expression, frozenset(marks)) is holds


def test_an_expression_with_anything_but_marks_and_operators_is_refused():
    with pytest.raises(ValueError, match=r"-m 'slow == 1'"):
        mark_expression_holds('slow == 1', frozenset())


def test_the_lanes_are_read_from_the_scripts_ci_runs():
    by_name = {lane.name: lane for lane in lanes()}
    assert list(by_name) == ['newest', 'timm 1.0.23', 'timm 1.0.28', 'floor']
    assert by_name['newest'] == Lane('newest', ('tests',), None)
    for release in ('timm 1.0.23', 'timm 1.0.28'):  # leave out the slow tests and the timm-free ones, nothing else
        lane = by_name[release]
        assert lane.runs('tests/test_sam.py::test_x', frozenset())
        assert not lane.runs('tests/test_sam.py::test_x', frozenset({'slow'}))
        assert not lane.runs('tests/test_sam.py::test_x', frozenset({MARK}))
        assert not lane.runs('tests/test_sam.py::test_x', frozenset({MODELS_MARK}))
    floor = by_name['floor']
    assert floor.runs('tests/test_models.py::test_x[vit_small_cb]', frozenset({'slow'}))
    assert not floor.runs('tests/test_sam.py::test_x', frozenset())
    assert floor.runs('tests/test_recipes.py::test_sam_runs_in_real_train_py_and_resumes', frozenset())
    assert not floor.runs('tests/test_recipes.py::test_sam_runs_in_real_train_py_and_resumes_twice', frozenset())


@pytest.mark.slow
def test_every_test_runs_in_some_lane(collected):
    every = lanes()
    nowhere = [t for t, marks in collected.items() if not any(lane.runs(t, marks) for lane in every)]
    assert not nowhere, f'{len(nowhere)} test(s) no lane of .ci/run runs, e.g. {nowhere[:3]}'


def lanes_section(collected) -> str:
    """docs/compatibility.md's list of what each lane leaves out, from the lanes' scripts and the suite's marks
    (lanes that leave out the same tests share their rows)."""
    every = lanes()
    groups: dict = {}
    for lane in every:
        groups.setdefault(repr(left_out(lane, collected, every)), []).append(lane)
    lines = ['| lanes | leave out | marked | run instead in |', '|---|---|---|---|']
    for members in groups.values():
        names = ', '.join(lane.name for lane in members)
        gaps = left_out(members[0], collected, every)
        if not gaps:
            lines.append(f'| {names} | nothing | | |')
        elif members[0].paths != ('tests',):
            n = sum(g[0] for g in gaps.values())
            lines.append(f'| {names} | all but the {len(collected) - n} tests of `{"`, `".join(members[0].paths)}`: '
                         f'{n} tests | | {", ".join(sorted({o for g in gaps.values() for o in g[2]}))} |')
        else:
            lines.extend(f'| {names} | `{module}`: {n} of {total} | {", ".join(why)} | {", ".join(others)} |'
                         for module, (n, total, others, why) in gaps.items())
    return '\n'.join(lines)


@pytest.mark.slow
def test_compatibility_doc_lists_what_each_lane_leaves_out(collected):
    text = COMPATIBILITY.read_text()
    assert BEGIN in text and END in text, f'docs/compatibility.md has no {BEGIN} ... {END} block'
    written = text.split(BEGIN)[1].split(END)[0].strip()
    expected = lanes_section(collected)
    assert written == expected, ('docs/compatibility.md lists other gaps than the lanes have; write this between '
                                 f'{BEGIN} and {END}:\n{expected}')


def _code(node: ast.AST) -> str:
    """``node``'s code without its comments and docstrings (what the code names, not what its prose mentions)."""
    node = copy.deepcopy(node)
    for inner in ast.walk(node):
        body = getattr(inner, 'body', None)
        if isinstance(inner, (ast.FunctionDef, ast.ClassDef)) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            inner.body = body[1:] or [ast.Pass()]
    return ast.unparse(node)


def _marked_sources(path: Path) -> List[str]:
    """The source a mark of ``path`` vouches for: the whole module under a module-level ``pytestmark``; else each
    marked test function (its code and decorators, without comments and docstrings) with the module-level
    definitions its names refer to (a constant or helper computed from timm's scripts at import, which the watch
    does not see)."""
    text = path.read_text()
    tree = ast.parse(text)
    marks = (f'pytest.mark.{MARK}', f'pytest.mark.{MODELS_MARK}')
    if any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == 'pytestmark' for t in node.targets)
           and any(m in ast.unparse(node.value) for m in marks) for node in tree.body):
        return [text]
    defined = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign) else [node] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else []
        for target in targets:
            name = getattr(target, 'id', None) or getattr(target, 'name', None)
            if name:
                defined[name] = node
    sources = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(m in ast.unparse(d) for d in node.decorator_list for m in marks):
            names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & set(defined) - {node.name})
            sources.append('\n'.join(_code(n) for n in [node, *(defined[name] for name in names)]))
    return sources


def test_a_test_marked_timm_free_or_models_only_names_nothing_bound_to_the_timm_release():
    marked = {p.name: _marked_sources(p) for p in sorted((ROOT / 'tests').glob('test_*.py'))
              if p.name != 'test_ci_lanes.py'}
    marked = {name: sources for name, sources in marked.items() if sources}
    assert len(marked) >= 35, sorted(marked)  # the marks this test guards are there
    bound = {name: sorted({b for source in sources for b in VERSION_BOUND.findall(source)})
             for name, sources in marked.items()}
    assert not {k: v for k, v in bound.items() if v}, (
        f'tests marked {MARK} or {MODELS_MARK} (with the module-level names they use) that name something of the '
        f'timm release (the release lanes must run them): {({k: v for k, v in bound.items() if v})}')


def test_the_check_of_marked_tests_reads_each_marked_test_and_what_it_uses(tmp_path):
    module = tmp_path / 'test_example.py'
    module.write_text(f"""import pytest
ARGS = read('train.py')
SIZES = (1, 2)


@pytest.mark.{MODELS_MARK}
@pytest.mark.parametrize('size', SIZES)
def test_free(size):
    '''As train.py builds it (prose: not read).'''
    assert size  # as validate.py does


@pytest.mark.{MARK}
def test_uses_args():
    assert ARGS


def test_unmarked():
    assert 'validate.py'
""")
    sources = _marked_sources(module)
    assert len(sources) == 2 and 'SIZES = (1, 2)' in sources[0] and 'test_unmarked' not in ''.join(sources)
    assert [VERSION_BOUND.findall(s) for s in sources] == [[], ['train.py']]
    module.write_text(f"import pytest\npytestmark = pytest.mark.{MARK}\n\ndef test_x():\n    assert 'train.py'\n")
    assert _marked_sources(module) == [module.read_text()]


def test_a_watched_call_into_timm_is_named():
    import timm

    with TimmCallWatch() as watch:
        timm.list_models('vit_small_patch16_224')
    assert watch.first is not None and watch.first.startswith("timm's list_models() (timm/models/_registry.py:")


def test_a_watched_child_process_is_named():
    with TimmCallWatch() as watch:
        subprocess.run([sys.executable, '-c', 'pass'], check=True)
    assert watch.first == 'a child process (Popen._execute_child)'


def test_a_watched_forkserver_child_is_named():
    """torch.multiprocessing's start_method='forkserver' (tests/_sam_reference.py's spawn_gloo): the server forks
    the child; this process only asks for it, in popen_forkserver's _launch."""
    import multiprocessing

    with TimmCallWatch() as watch:
        process = multiprocessing.get_context('forkserver').Process(target=int)
        process.start()
        process.join()
    assert process.exitcode == 0 and watch.first == watch.first_bound == 'a child process (Popen._launch)'


def test_a_watch_over_plain_torch_sees_nothing():
    import torch

    with TimmCallWatch() as watch:
        torch.nn.Linear(3, 2)(torch.ones(1, 3)).sum().backward()
    assert watch.first is None


# slow: a pytest process of its own (6 s); the watch it tests runs only where the marked tests run, the newest
# lane, which runs it
@pytest.mark.slow
def test_a_timm_free_test_that_calls_timm_fails_with_the_call_named(pytester):
    pytester.makeconftest(f'import sys; sys.path.insert(0, {str(ROOT / "tests")!r})\n'
                          'from _timm_free import register\n'
                          'def pytest_configure(config):\n    register(config)\n')
    pytester.makeini(f'[pytest]\nmarkers =\n    {MARK}: x\n')
    pytester.makepyfile(test_marked='''
import pytest
import timm

@pytest.mark.timm_free
def test_calls_timm():
    timm.list_models('resnet18')

@pytest.mark.timm_free
def test_plain():
    assert sum([1, 2]) == 3

def test_unmarked_calls_timm():
    timm.list_models('resnet18')
''')
    result = pytester.runpytest_subprocess('-q', '-p', 'no:cacheprovider')
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([f"*test_calls_timm is marked {MARK} (the release lanes leave it out) but called "
                                 "timm's list_models() (timm/models/_registry.py:*): remove the mark*"])


# slow: a pytest process of its own (6 s); the watch it tests runs only where the marked tests run, the newest
# lane, which runs it
@pytest.mark.slow
def test_a_models_only_test_that_calls_a_release_bound_part_fails_with_the_call_named(pytester):
    pytester.makeconftest(f'import sys; sys.path.insert(0, {str(ROOT / "tests")!r})\n'
                          'from _timm_free import register\n'
                          'def pytest_configure(config):\n    register(config)\n')
    pytester.makeini(f'[pytest]\nmarkers =\n    {MODELS_MARK}: x\n')
    pytester.makepyfile(test_marked='''
import pytest
import timm
import torch
from timm.optim import create_optimizer_v2

pytestmark = pytest.mark.timm_models_only

def test_builds_and_runs_a_model():
    model = timm.create_model('resnet10t', num_classes=3)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 3)

def test_builds_an_optimizer():
    create_optimizer_v2(torch.nn.Linear(2, 2), 'adamw')
''')
    result = pytester.runpytest_subprocess('-q', '-p', 'no:cacheprovider')
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([f"*test_builds_an_optimizer is marked {MODELS_MARK} (the release lanes leave it out) "
                                 "but called timm's create_optimizer_v2() (timm/optim/_optim_factory.py:*"])
