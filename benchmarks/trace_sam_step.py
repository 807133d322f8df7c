"""What one SAM step runs: the timm-ext functions a steady step enters, per route, traced with ``sys.setprofile``.

The third step of a loop is traced (the first two pay the set-up), on ``vit_tiny_cb`` with
``create_optimizer_v2(model, opt='samadamw')``, one process, CPU, fp32. Counted: each distinct function of the
package a step enters, by file. Not counted: the model's own code (``timm_ext/models``, ``timm_ext/layers``: the
user's model), the user's closure and whatever it calls (its ``optimizer.zero_grad()``, its model), nor
comprehensions and lambdas. A frame read by timm-ext code during the
step (``sys._getframe``, ``inspect.currentframe``) is listed too; lightning and accelerate are imported first, as
any Lightning or Hugging Face script does, so a step that looks for their callers would show it.

    python benchmarks/trace_sam_step.py            # the table and each route's functions
    python benchmarks/trace_sam_step.py --write    # the same table into docs/architecture.md

``tests/test_benchmarks_trace_sam_step.py`` holds each route to its limit and docs/architecture.md to this output.
"""
import argparse
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / 'timm_ext'
MODEL_CODE = (PACKAGE / 'models', PACKAGE / 'layers')  # the user's model: not the step's own work
NOT_FUNCTIONS = ('<listcomp>', '<dictcomp>', '<setcomp>', '<genexpr>', '<lambda>')
FRAME_READS = (sys._getframe, inspect.currentframe)
DOC = ROOT / 'docs' / 'architecture.md'
BEGIN, END = '<!-- trace_sam_step: begin -->', '<!-- trace_sam_step: end -->'

# (route, distinct functions at most, files at most): issue 55's limits, held by the test
LIMITS = {
    'step(closure), torch\'s convention': (15, 3),
    'step(closure), davda54/sam\'s convention': (15, 3),
    'first_step() + second_step()': (10, 2),
    'step() replaying a timm task': (30, 6),
}


class Trace:
    """The package functions (file, qualified name) entered while active, and the frame reads made from them;
    nothing while a user's closure (a function named ``closure``) runs."""

    def __init__(self) -> None:
        self.functions: Dict[Tuple[str, str], int] = {}
        self.frame_reads: List[Tuple[str, str]] = []
        self._closures: List[object] = []  # the frames of the user's closures running now

    @staticmethod
    def _where(frame) -> str:
        """``optim/sam.py`` for a frame of the package outside the model's code, '' for any other."""
        path = Path(frame.f_code.co_filename)
        if not path.is_relative_to(PACKAGE) or any(path.is_relative_to(m) for m in MODEL_CODE):
            return ''
        return str(path.relative_to(PACKAGE))

    def __call__(self, frame, event, arg) -> None:
        if frame.f_code.co_name == 'closure' and frame.f_code.co_filename == __file__:
            if event == 'call':
                self._closures.append(frame)
            elif event == 'return' and self._closures and self._closures[-1] is frame:
                self._closures.pop()
            return
        if self._closures:
            return
        if event == 'call':
            where = self._where(frame)
            if where and frame.f_code.co_name not in NOT_FUNCTIONS:
                key = (where, getattr(frame.f_code, 'co_qualname', frame.f_code.co_name))
                self.functions[key] = self.functions.get(key, 0) + 1
        elif event == 'c_call' and arg in FRAME_READS:
            where = self._where(frame)
            if where:
                self.frame_reads.append((where, getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)))

    def run(self, step: Callable[[], None]) -> 'Trace':
        sys.setprofile(self)
        try:
            step()
        finally:
            sys.setprofile(None)
        return self

    @property
    def files(self) -> List[str]:
        return sorted({f for f, _ in self.functions})


def _routes() -> Dict[str, Callable[[], Callable[[], None]]]:
    """Each route: a function that builds a fresh model and optimizer and returns one step of the loop."""
    import timm
    from timm.optim import create_optimizer_v2
    from timm.task import ClassificationTask

    import timm_ext  # noqa: F401  (registers vit_tiny_cb and samadamw)
    from timm_ext.optim import replay_timm_task

    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1])

    def setup():
        torch.manual_seed(0)
        model = timm.create_model('vit_tiny_cb', img_size=32, patch_size=8, depth=2, num_classes=2)
        return model, create_optimizer_v2(model, opt='samadamw', lr=1e-3)

    def torch_closure():
        model, opt = setup()

        def closure():
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss
        return lambda: opt.step(closure)

    def davda54_closure():
        model, opt = setup()

        def closure():
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            return loss

        def step():
            closure()  # the caller's backward at w (its own code: not counted)
            opt.step(closure)
            opt.zero_grad()
        return step

    def two_steps():
        model, opt = setup()

        def step():
            F.cross_entropy(model(x), y).backward()
            opt.first_step(zero_grad=True)
            F.cross_entropy(model(x), y).backward()
            opt.second_step(zero_grad=True)
        return step

    def replayed():
        model, opt = setup()
        task = ClassificationTask(model, nn.CrossEntropyLoss(), verbose=False)
        replay_timm_task(opt, task)

        def step():
            task(x, y)['loss'].backward()
            opt.step()
            opt.zero_grad()
        return step

    return dict(zip(LIMITS, (torch_closure, davda54_closure, two_steps, replayed)))


def trace_routes() -> Dict[str, Trace]:
    """Each route's third step, traced (lightning and accelerate imported first, when installed)."""
    for framework in ('lightning', 'accelerate'):
        if importlib.util.find_spec(framework) is not None:
            importlib.import_module(framework)
    traces = {}
    for name, make in _routes().items():
        step = make()
        step()
        step()
        traces[name] = Trace().run(step)
    return traces


def table(traces: Dict[str, Trace]) -> str:
    """The Markdown table docs/architecture.md shows, and each route's functions by file."""
    lines = ['| route | distinct functions | files | frame reads |', '|---|---:|---:|---:|']
    for name, trace in traces.items():
        lines.append(f'| {name} | {len(trace.functions)} | {len(trace.files)} | {len(trace.frame_reads)} |')
    lines.append('')
    for name, trace in traces.items():
        lines.append(f'- {name}:')
        for file in trace.files:
            names = ', '.join(f'`{q}`' for f, q in trace.functions if f == file)
            lines.append(f'  - `{file}`: {names}')
    return '\n'.join(lines)


def write_doc(text: str, doc: Path = DOC) -> None:
    """Replace the traced section of docs/architecture.md (between its two markers) by ``text``."""
    source = doc.read_text()
    head, _, rest = source.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest or not tail and END not in rest:
        raise SystemExit(f'{doc}: the markers {BEGIN} and {END} are missing')
    doc.write_text(f'{head}{BEGIN}\n{text}\n{END}{tail}')


def doc_section(doc: Path = DOC) -> str:
    """What docs/architecture.md shows between the markers now."""
    return doc.read_text().partition(BEGIN)[2].partition(END)[0].strip('\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--write', action='store_true', help='write the table into docs/architecture.md')
    args = parser.parse_args()
    torch.set_num_threads(1)
    text = table(trace_routes())
    print(text)
    if args.write:
        write_doc(text)
        print(f'written to {DOC.relative_to(ROOT)}')


if __name__ == '__main__':
    main()
