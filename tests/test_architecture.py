"""The layering of docs/architecture.md, checked on the source: imports point one way (no cycle anywhere in the
repository, lazy imports included), no module imports another module's private name, and each layer of the
package imports only the layers below it."""
import ast
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]
# script folders: their modules import each other by file name (the folder is on sys.path when they run)
SCRIPT_FOLDERS = ('benchmarks', 'reproduction', 'tests', '.ci')

# the package's layers, lowest first (docs/architecture.md): a module may import its own layer and those below
LAYERS = [
    ('foundation', {'arg_types', '_files', '_resources', '_requirements', '_summary_csv', '_timm_backports',
                    '_timm_compat', '_torchvision', 'load_errors', 'machine', 'papers', 'version'}),
    ('layers', {'layers'}),
    ('models and optim', {'models', 'optim'}),
    ('recipes, data, catalog', {'recipes', 'data', 'catalog'}),
    ('hub', {'hub'}),
    ('launch and analysis', {'launch', 'analysis', 'integrations'}),
    ('applications', {'demo', 'doctor'}),
    ('cli', {'cli'}),
]


def _package_modules() -> Dict[str, Path]:
    out = {}
    for path in sorted((ROOT / 'timm_ext').rglob('*.py')):
        parts = list(path.relative_to(ROOT).with_suffix('').parts)
        if parts[-1] == '__init__':
            parts = parts[:-1]
        out['.'.join(parts)] = path
    for path in sorted(ROOT.glob('timm_ext_cli*.py')) + sorted(ROOT.glob('timm_ext_cli/**/*.py')):
        parts = list(path.relative_to(ROOT).with_suffix('').parts)
        if parts[-1] == '__init__':
            parts = parts[:-1]
        out['.'.join(parts)] = path
    return out


def _imports(path: Path, module: str, known: Dict[str, Path]) -> List[ast.AST]:
    """(imported module, node) for every import of a module in ``known``, at any depth of the file."""
    out = []
    package = module if path.name == '__init__.py' else module.rpartition('.')[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node) for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = package.split('.')[:len(package.split('.')) - node.level + 1]
                base = '.'.join(parts + ([base] if base else []))
            for alias in node.names:
                target = f'{base}.{alias.name}' if f'{base}.{alias.name}' in known else base
                if target in known:
                    out.append((target, node))
    return out


def _graphs() -> Dict[str, Dict[str, Set[str]]]:
    graphs = {'package': defaultdict(set)}
    package = _package_modules()
    for module, path in package.items():
        for target, _ in _imports(path, module, package):
            if target != module:
                graphs['package'][module].add(target)
    for folder in SCRIPT_FOLDERS:
        files = {p.stem: p for p in sorted((ROOT / folder).glob('*.py'))} if (ROOT / folder).is_dir() else {}
        graph = graphs.setdefault(folder, defaultdict(set))
        for module, path in files.items():
            for target, _ in _imports(path, module, files):
                if target != module:
                    graph[module].add(target)
    return graphs


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found = []
    nodes = sorted(set(graph) | {t for ts in graph.values() for t in ts})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]
    assert _cycles({'a': {'b'}, 'b': set()}) == []


@pytest.mark.parametrize('where', ['package'] + list(SCRIPT_FOLDERS))
def test_no_import_cycle(where):
    assert _cycles(_graphs()[where]) == [], f'import cycle in {where}: move what both sides need one layer down'


def _layer(module: str) -> int:
    name = module.split('.')[1] if module.startswith('timm_ext.') else module
    if module == 'timm_ext':
        return len(LAYERS) - 1  # the package's __init__ imports what registers with timm
    if module.startswith('timm_ext_cli') or module == 'timm_ext.__main__':
        return len(LAYERS)  # the command's entry points, above everything
    for rank, (_, names) in enumerate(LAYERS):
        if name in names:
            return rank
    raise AssertionError(f'{module} is in no layer of tests/test_architecture.py (and docs/architecture.md): add it')


def test_imports_point_down_the_layers():
    package = _package_modules()
    upward = []
    for module, path in package.items():
        for target, node in _imports(path, module, package):
            if target == module or module == 'timm_ext' or target == 'timm_ext_cli.commands':
                continue  # timm_ext_cli.commands: the fast command table, importing nothing of timm-ext
            if _layer(target) > _layer(module):
                upward.append(f'{path.relative_to(ROOT)}:{node.lineno} imports {target} '
                              f'({LAYERS[_layer(target)][0] if _layer(target) < len(LAYERS) else "entry point"})')
    assert upward == []


def test_applications_use_the_public_library_only():
    """benchmarks/ and reproduction/ import timm_ext's public modules, never a package-private one (``_hooks``)."""
    private = []
    for folder in ('benchmarks', 'reproduction'):
        for path in sorted((ROOT / folder).glob('*.py')):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [node.module or ''] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                for name in names:
                    if name.startswith('timm_ext') and any(part.startswith('_') for part in name.split('.')):
                        private.append(f'{path.relative_to(ROOT)}:{node.lineno} imports {name}')
    assert private == []


def _is_module(path: Path, node: ast.ImportFrom, name: str) -> bool:
    """``from timm_ext import _requirements``: a package-private module, imported whole (by its own test)."""
    folder = ROOT.joinpath(*(node.module or '').split('.')) if not node.level else path.parent
    return (folder / f'{name}.py').is_file() or (folder / name / '__init__.py').is_file()


def test_no_private_name_is_imported_from_another_module():
    private = []
    files = list(_package_modules().values())
    for folder in SCRIPT_FOLDERS:
        files += sorted((ROOT / folder).glob('*.py'))
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names if a.name.startswith('_') and not a.name.startswith('__')
                         and not _is_module(path, node, a.name)]
                if names and (node.level or (node.module or '').split('.')[0] in ('timm_ext', 'timm_ext_cli')
                              or (path.parent / f'{node.module}.py').exists()):
                    private.append(f'{path.relative_to(ROOT)}:{node.lineno} from {node.module} import {names}')
    assert private == []


# issue 37: SAM's core is one small file that knows no training framework and reads no caller's frame
SAM_CORE = ('timm_ext.optim.sam', 'timm_ext.optim.gsam', 'timm_ext.optim.looksam')
FRAMEWORKS = ('lightning', 'pytorch_lightning', 'accelerate', 'transformers', 'deepspeed', 'timm.task')
FRAME_READS = ('_getframe', 'currentframe', 'f_back', 'f_locals', 'inspect.stack')


def _external_imports(path: Path) -> Set[str]:
    """Every absolute module name a file imports, at any depth (lazy imports included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


def _import_closure(starts) -> Set[str]:
    """The package modules ``starts`` import, transitively (their parent packages' __init__ left out)."""
    package = _package_modules()
    seen, todo = set(), list(starts)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo.extend(t for t, _ in _imports(package[module], module, package) if t != module)
    return seen


def test_sam_core_is_one_small_file_importing_a_handful_of_modules():
    path = ROOT / 'timm_ext' / 'optim' / 'sam.py'
    package = _package_modules()
    direct = {t for t, _ in _imports(path, 'timm_ext.optim.sam', package)}
    assert len(path.read_text().splitlines()) <= 300
    assert len(direct) <= 6, sorted(direct)


def test_sam_core_knows_no_framework_and_reads_no_frame():
    closure = _import_closure(SAM_CORE)
    package = _package_modules()
    assert 'timm_ext.optim.sam_step' not in closure and 'timm_ext.optim.task_recorder' not in closure  # drivers above
    for module in sorted(closure):
        imported = _external_imports(package[module])
        framework = [m for m in imported if any(m == f or m.startswith(f + '.') for f in FRAMEWORKS)]
        assert not framework, f'{module} imports {framework}'
        source = package[module].read_text()
        assert not [r for r in FRAME_READS if r in source], f'{module} reads a caller\'s frame'


def test_the_closure_finder_sees_frameworks_and_frame_reads():
    """The two checks above can fail: the framework adapters are caught by them."""
    package = _package_modules()
    assert 'sys._getframe' in package['timm_ext.integrations.accelerate'].read_text()
    closure = _import_closure(['timm_ext.integrations.lightning'])
    assert 'timm_ext.optim.framework_checks' in closure
