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


@pytest.mark.timm_free
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


@pytest.mark.timm_free
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


@pytest.mark.timm_free
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


# issue 37: SAM's core knows no training framework and reads no caller's frame; issue 55: SAM.step() reads top to
# bottom in sam.py (no step driver), the optional machinery composed in only when configured, and the
# training-task replay sits above the core, attached through SAM.attach_replay
SAM_CORE = ('timm_ext.optim.sam', 'timm_ext.optim.gsam', 'timm_ext.optim.looksam')
FRAMEWORKS = ('lightning', 'pytorch_lightning', 'accelerate', 'transformers', 'deepspeed', 'timm.task')
FRAME_READS = ('_getframe', 'currentframe', 'f_back', 'f_locals', 'inspect.stack')
REPLAY = ('timm_ext.optim.task_replay', 'timm_ext.optim.replay_passes', 'timm_ext.optim.task_recorder',
          'timm_ext.optim.task_finder')


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


def _long_functions(path: Path, limit: int) -> List[str]:
    """The functions of ``path`` longer than ``limit`` lines (decorators and docstrings included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.end_lineno - start + 1 > limit:
                found.append(f'{path.name}:{node.lineno} {node.name} ({node.end_lineno - start + 1} lines)')
    return found


def test_sam_core_is_one_readable_file():
    """sam.py at most 450 lines; no function of sam.py or sam_functional.py over 60 lines (issue 55)."""
    optim = ROOT / 'timm_ext' / 'optim'
    assert len((optim / 'sam.py').read_text().splitlines()) <= 450
    assert _long_functions(optim / 'sam.py', 60) + _long_functions(optim / 'sam_functional.py', 60) == []
    assert not (optim / 'sam_step.py').exists()  # the step driver is gone: SAM.step is the step


def test_the_long_function_finder_finds_one(tmp_path):
    path = tmp_path / 'long.py'
    path.write_text('def f():\n' + '    x = 1\n' * 60)
    assert _long_functions(path, 60) == ['long.py:1 f (61 lines)'] and _long_functions(path, 61) == []


def test_sam_core_knows_no_framework_and_reads_no_frame():
    closure = _import_closure(SAM_CORE)
    package = _package_modules()
    assert not closure & set(REPLAY), sorted(closure & set(REPLAY))  # the task replay is above, attached at run time
    for module in sorted(closure):
        imported = _external_imports(package[module])
        framework = [m for m in imported if any(m == f or m.startswith(f + '.') for f in FRAMEWORKS)]
        assert not framework, f'{module} imports {framework}'
        source = package[module].read_text()
        assert not [r for r in FRAME_READS if r in source], f'{module} reads a caller\'s frame'


def test_the_closure_finder_sees_frameworks_and_frame_reads():
    """The two checks above can fail: a framework adapter's closure holds the framework checks, and the factory's
    model lookup reads a frame (once, while create_optimizer_v2 builds the optimizer; never in a step)."""
    package = _package_modules()
    assert 'sys._getframe' in package['timm_ext.optim.sam_factory'].read_text()
    closure = _import_closure(['timm_ext.integrations.lightning'])
    assert 'timm_ext.optim.framework_checks' in closure
    assert not [r for r in FRAME_READS if r in package['timm_ext.integrations.accelerate'].read_text()]
    assert not [r for r in FRAME_READS if r in package['timm_ext.integrations.lightning'].read_text()]


SAM_FAMILY = ('SAM', 'GSAM', 'LookSAM', 'WrappedOptimizer', 'FactorySAM', 'FactoryGSAM', 'FactoryLookSAM')


@pytest.mark.timm_free
def test_no_module_assigns_to_the_sam_classes():
    """``SAM.driver = ...`` from timm_ext.optim (issue 45's finding): a class attribute set from another file is a
    step nobody can follow by reading sam.py. No module assigns to (or setattr()s) a SAM-family class."""
    found = []
    for module, path in _package_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                        target.value.id in SAM_FAMILY:
                    found.append(f'{module}:{node.lineno} {target.value.id}.{target.attr} = ...')
            if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'setattr' and node.args and \
                    getattr(node.args[0], 'id', None) in SAM_FAMILY:
                found.append(f'{module}:{node.lineno} setattr({node.args[0].id}, ...)')
    assert found == []


# ---- a traced step: what runs, not only what is imported (issue 45) ------------------------------------------

def _traced_routes():
    """(name, optimizer, run one update) for each way SAM is stepped, on a tiny model."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from timm.optim import create_optimizer_v2
    from timm.task import ClassificationTask

    from timm_ext.optim import GSAM, SAM, LookSAM, replay_timm_task

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.GELU(), nn.Linear(8, 3))

    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))

    def torch_closure(m, opt):
        def closure(chunk=lambda *batch: batch):  # m-sharpness hands it the chunk that cuts the batch
            opt.zero_grad()
            xs, ys = chunk(x, y)
            loss = F.cross_entropy(m(xs), ys)
            loss.backward()
            return loss
        return lambda: opt.step(closure)

    def davda54_closure(m, opt):
        def closure():
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            return loss

        def run():
            F.cross_entropy(m(x), y).backward()
            opt.step(closure)
        return run

    def two_steps(m, opt):
        def run():
            F.cross_entropy(m(x), y).backward()
            opt.first_step()
            F.cross_entropy(m(x), y).backward()
            opt.second_step()
        return run

    def replayed(m, opt):
        task = ClassificationTask(m, nn.CrossEntropyLoss(), verbose=False)
        replay_timm_task(opt, task)

        def run():
            task(x, y)['loss'].backward()
            opt.step()
        return run

    def fp16(m, opt):
        scaler = torch.amp.GradScaler('cpu', init_scale=2.0 ** 8)

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(m(x), y)
            scaler.scale(loss).backward()
            return loss

        def run():
            opt.step(closure, grad_scaler=scaler)
            scaler.update()
        return run

    routes = []
    for name, make, drive in [
            ('SAM, torch closure', lambda m: SAM(m.parameters(), torch.optim.SGD, lr=0.1, model=m), torch_closure),
            ('SAM, davda54 closure', lambda m: SAM(m.parameters(), torch.optim.SGD, lr=0.1), davda54_closure),
            ('SAM, m-sharpness', lambda m: SAM(m.parameters(), torch.optim.SGD, lr=0.1, m_sharpness=4, model=m),
             torch_closure),
            ('SAM, first/second step', lambda m: SAM(m.parameters(), torch.optim.SGD, lr=0.1, model=m), two_steps),
            ('samadamw, task replay', lambda m: create_optimizer_v2(m, 'samadamw', lr=1e-3), replayed),
            ('SAM, fp16 closure', lambda m: SAM(m.parameters(), torch.optim.SGD, lr=0.1, model=m), fp16),
            ('GSAM, torch closure', lambda m: GSAM(m.parameters(), torch.optim.SGD, lr=0.1, model=m), torch_closure),
            ('LookSAM, plain and SAM steps', lambda m: LookSAM(m.parameters(), torch.optim.SGD, lr=0.1, interval=2,
                                                               model=m), torch_closure)]:
        m = model()
        opt = make(m)
        routes.append((name, opt, drive(m, opt)))
    return routes


def _project_file(filename: str) -> str:
    """``optim/sam.py`` for a file of the package, '' for any other."""
    return str(Path(filename).resolve().relative_to(ROOT / 'timm_ext')) if filename.startswith(
        str(ROOT / 'timm_ext')) else ''


def _project_stack(frame) -> List:
    """(file, function) of each timm-ext frame from ``frame`` outwards."""
    out = []
    while frame is not None:
        if _project_file(frame.f_code.co_filename):
            out.append((_project_file(frame.f_code.co_filename), frame.f_code.co_name))
        frame = frame.f_back
    return out


@pytest.mark.filterwarnings('ignore:SAM does not know the model')
def test_a_traced_step_reaches_the_base_step_within_four_frames_of_two_files():
    """From SAM.step (or second_step) to the base optimizer's step: at most 4 frames of timm-ext, in sam.py (and
    m_sharpness.py, where m-sharpness is configured) only; a plain closure step all in sam.py."""
    import sys
    chains = {}
    for name, opt, run in _traced_routes():
        seen = []

        def pre_hook(optimizer, args, kwargs, seen=seen):
            seen.append(_project_stack(sys._getframe(1)))
        handle = opt.base_optimizer.register_step_pre_hook(pre_hook)
        for _ in range(2):
            run()
            opt.zero_grad()
        handle.remove()
        chains[name] = seen
    for name, seen in chains.items():
        assert seen, f'{name}: the base optimizer never stepped'
        for chain in seen:
            assert len(chain) <= 4 and {f for f, _ in chain} <= {'optim/sam.py', 'optim/m_sharpness.py'}, (name, chain)
    assert chains['SAM, torch closure'][0] == [('optim/sam.py', 'apply_descent'), ('optim/sam.py', '_update_from_here'),
                                               ('optim/sam.py', '_closure_update'), ('optim/sam.py', 'step')]


@pytest.mark.filterwarnings('ignore:SAM does not know the model')
def test_a_traced_step_runs_only_code_its_imports_or_its_arguments_name():
    """Every timm-ext function a step runs lives in a module the optimizer's class imports (transitively), or in one
    the step was handed at run time by name: the training-task replay ``replay_timm_task`` attached, and the framework
    checks registered with ``framework_checks``. A call moved out of the import graph (a driver set on the class
    from another module, an import hook) fails here."""
    import sys

    from timm_ext.optim import framework_checks
    package = {str(path.resolve()): module for module, path in _package_modules().items()}
    checks = [f.__module__ for f in framework_checks._closure_checks + framework_checks._stepless_checks]
    for name, opt, run in _traced_routes():
        ran = set()

        def profile(frame, event, arg, ran=ran):
            if event == 'call' and frame.f_code.co_filename in package:
                ran.add(package[frame.f_code.co_filename])
        replay = opt.replay
        allowed = _import_closure([type(opt).__module__, *checks] + ([type(replay).__module__] if replay else []))
        sys.setprofile(profile)
        try:
            run()
        finally:
            sys.setprofile(None)
        assert ran and ran <= allowed, (name, sorted(ran - allowed))


@pytest.mark.filterwarnings('ignore:SAM does not know the model')
def test_only_the_sam_classes_own_files_set_their_attributes(monkeypatch):
    """Building and stepping a SAM on every route: each attribute set on it from timm-ext code is set by the files
    of its own classes (sam.py, gsam.py, looksam.py, base_optimizer.py, sam_factory.py), never by a driver, the task
    replay or an integration."""
    import sys

    from timm_ext.optim import SAM
    setters = []

    def audit(self, name, value):
        caller = _project_file(sys._getframe(1).f_code.co_filename)
        if caller:
            setters.append((type(self), caller, name))
        object.__setattr__(self, name, value)
    monkeypatch.setattr(SAM, '__setattr__', audit)
    for _, _, run in _traced_routes():
        run()
    for cls, caller, name in setters:
        own = {_project_file(getattr(sys.modules[c.__module__], '__file__', '') or '') for c in cls.__mro__}
        assert caller in own, f'{caller} sets {cls.__name__}.{name}'
    assert setters  # the audit saw SAM's own assignments
