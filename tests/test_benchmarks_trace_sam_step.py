"""benchmarks/trace_sam_step.py: what one steady SAM step runs, per route (issue 55). Each route within its limit of
distinct timm-ext functions and files, no frame read by timm-ext code with lightning and accelerate imported, and
docs/architecture.md showing exactly what the tracer finds."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'benchmarks'))  # scripts beside the package
import trace_sam_step  # noqa: E402


@pytest.fixture(scope='module')
def traces():
    return trace_sam_step.trace_routes()


@pytest.mark.parametrize('route', list(trace_sam_step.LIMITS))
def test_a_steady_step_enters_at_most_its_limit(traces, route):
    functions, files = trace_sam_step.LIMITS[route]
    trace = traces[route]
    assert len(trace.functions) <= functions and len(trace.files) <= files, trace_sam_step.table({route: trace})
    assert trace.frame_reads == []  # lightning and accelerate are imported (trace_routes)
    assert ('optim/sam.py', 'SAM.apply_descent') in trace.functions  # it traced a real update


def test_the_plain_closure_step_is_sam_py_its_arithmetic_and_the_closure_convention(traces):
    assert traces["step(closure), torch's convention"].files == [
        'optim/left_gradients.py', 'optim/sam.py', 'optim/sam_functional.py']
    assert traces['first_step() + second_step()'].files == ['optim/sam.py', 'optim/sam_functional.py']


def test_docs_architecture_shows_the_traced_steps(traces):
    assert trace_sam_step.doc_section() == trace_sam_step.table(traces), (
        'docs/architecture.md differs from the traced steps: python benchmarks/trace_sam_step.py --write')


def test_the_tracer_counts_functions_and_sees_frame_reads():
    """The checks above can fail: a package function is counted by file, and a frame read is seen."""
    from timm_ext.optim import sam_factory, sam_functional

    trace = trace_sam_step.Trace().run(lambda: sam_functional.total_norm([torch.ones(2)]))
    assert list(trace.functions) == [('optim/sam_functional.py', 'total_norm')] and trace.frame_reads == []
    base = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    trace = trace_sam_step.Trace().run(lambda: sam_factory.model_given_to_factory(base))  # reads the callers' frames
    assert ('optim/sam_factory.py', 'model_given_to_factory') in trace.frame_reads
