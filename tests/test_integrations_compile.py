"""SAM's closure route with a ``torch.compile``d timm ViT (dropout and drop-path on, CPU): both passes, at w and
at w + e (the second inside ``torch.random.fork_rng`` with the first pass's random state restored), run the one
compiled graph, exactly as many graphs are compiled as for a compiled AdamW loop, and the weights are the eager
SAM run's.

Backend: ``aot_eager`` (Dynamo's graph capture and guards, and AOT autograd's joint forward-backward graph, run
with eager kernels). Inductor is not the default here because its cold compile of this 1-block ViT's forward and
backward took 25 to 55 s per graph on the 2-core CI CPU (a C++ build; 40 s with one compile thread), and the test
compiles twice (the eager comparison needs ``fallback_random``, another graph), against about 2 s for
``aot_eager``. Recompilation is decided by Dynamo's guards, which are the same whatever backend the graph goes to,
so the counts mean the same with either. ``TIMM_EXT_INDUCTOR_TESTS=1`` adds the same tests with ``inductor``.

Weight tolerance: ``||w_compiled - w_eager|| / ||w_eager - w_0|| <= 1e-2`` (the difference over the whole
displacement of the run, L2 over all parameters). A compiler may fuse and reorder float32 sums, and AdamW turns
such last-bit differences into visible ones for elements whose gradient is near zero (its update is close to
``lr * sign(g)``: up to 0.5 lr apart elementwise here), so elementwise ``allclose`` at float32 precision is the
wrong yardstick. Measured after these 3 steps: ``aot_eager`` 0 (bit-exact: eager's kernels in eager's order);
inductor with ``fallback_random`` 7.9e-4 (after 4 steps 8e-4, and 9e-4 for plain AdamW compiled vs eager: compiler
noise alone). The errors the check must catch are 0.47 (no ascent: the AdamW run) and 0.94 (a second pass with
other dropout masks); both are asserted above 0.1. 1e-2 is over ten times the noise and 47 times below the
smaller error.
"""
import contextlib
import os
from dataclasses import dataclass
from typing import Dict, Optional
from unittest import mock

import pytest
import timm
import torch
import torch._dynamo
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from timm.optim import create_optimizer_v2
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters

import timm_ext  # noqa: F401  (registers samadamw)
from timm_ext.optim import sam as sam_module

BACKENDS = [
    'aot_eager',
    pytest.param('inductor', marks=pytest.mark.skipif(
        os.environ.get('TIMM_EXT_INDUCTOR_TESTS') != '1',
        reason='inductor compiles for 25-55 s per graph on 2 CPU cores: set TIMM_EXT_INDUCTOR_TESTS=1')),
]
STEPS = 3
LR = 1e-3
RHO = 0.05
WEIGHT_RTOL = 1e-2  # ||w_compiled - w_eager|| / ||w_eager - w_0||: see the module docstring

pytestmark = pytest.mark.slow


def _vit() -> torch.nn.Module:
    """A 1-block ViT-Tiny at 32 px with the ViT-SAM paper's dropout (blocks and position embedding) and drop-path."""
    torch.manual_seed(0)
    return timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=8, depth=1, num_classes=10,
                             proj_drop_rate=0.1, pos_drop_rate=0.1, drop_path_rate=0.1).train()


@dataclass
class Run:
    model: torch.nn.Module
    compiles: Dict[str, int]  # what was compiled over the run (empty for an eager run)
    forwards: int  # calls of the (compiled) model


def _compiles(counter: CompileCounterWithBackend) -> Dict[str, int]:
    return dict(
        graphs_to_backend=counter.frame_count,  # one per Dynamo compile, recompiles included
        dynamo_frames=counters['frames']['ok'],
        unique_graphs=counters['stats']['unique_graphs'],
        aot_autograd=counters['aot_autograd']['total'],  # joint forward-backward graphs
        graph_breaks=sum(counters['graph_break'].values()),
    )


def _train(opt: str, backend: Optional[str], rho: float = RHO, fallback_random: bool = False,
           restore_rng: bool = True) -> Run:
    """STEPS steps of ``opt`` through ``optimizer.step(closure)`` on a fresh ViT, compiled with ``backend``
    (None: eager) in a fresh Dynamo; the same batch and random seed every run. ``restore_rng=False``: the
    negative control, a SAM whose second pass draws new masks (SAM's fork of the generators around the first pass
    made a no-op)."""
    torch._dynamo.reset()
    counters.clear()
    model = _vit()
    counter = CompileCounterWithBackend(backend) if backend else None
    forward = torch.compile(model, backend=counter) if counter else model
    kwargs = dict(rho=rho) if opt.startswith('sam') else {}
    optimizer = create_optimizer_v2(model, opt, lr=LR, weight_decay=0.05, **kwargs)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 32, 32, generator=gen), torch.randint(0, 10, (4,), generator=gen)
    forwards = 0
    torch.manual_seed(1)
    # SAM runs the first pass in a fork of the generators (the second then draws the same masks): no fork, new masks
    no_restore = mock.patch.object(sam_module, 'fork_rng', lambda devices: contextlib.nullcontext())
    with inductor_config.patch(fallback_random=fallback_random), (contextlib.nullcontext() if restore_rng
                                                                   else no_restore):
        for _ in range(STEPS):
            def closure():
                nonlocal forwards
                forwards += 1
                optimizer.zero_grad()
                loss = F.cross_entropy(forward(x), y)
                loss.backward()
                return loss
            optimizer.step(closure)
    compiles = _compiles(counter) if counter else {}
    torch._dynamo.reset()
    return Run(model, compiles, forwards)


@pytest.fixture(scope='module')
def runs():
    cache: Dict[tuple, Run] = {}

    def get(opt: str, backend: Optional[str], **kwargs) -> Run:
        if backend != 'inductor':
            kwargs.pop('fallback_random', None)  # aot_eager and eager always run aten's random ops
        key = (opt, backend, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = _train(opt, backend, **kwargs)
        return cache[key]
    return get


@torch.no_grad()
def _relative_distance(model: torch.nn.Module, reference: torch.nn.Module) -> float:
    start = _vit()
    params = list(zip(model.parameters(), reference.parameters(), start.parameters()))
    diff = torch.sqrt(sum(((p - r) ** 2).sum() for p, r, _ in params))
    moved = torch.sqrt(sum(((r - s) ** 2).sum() for _, r, s in params))
    return float(diff / moved)


@pytest.mark.parametrize('backend', BACKENDS)
def test_both_sam_passes_run_one_compiled_graph_like_adamw(runs, backend):
    """SAM calls the compiled model twice per step (at w, then at w + e under fork_rng in the restored random
    state); the second call hits the graph the first compiled: the counts are a compiled AdamW loop's."""
    sam, adamw = runs('samadamw', backend), runs('adamw', backend)
    assert (sam.forwards, adamw.forwards) == (2 * STEPS, STEPS)
    assert sam.compiles == adamw.compiles, f'SAM compiled {sam.compiles}, AdamW {adamw.compiles}'
    assert sam.compiles['graphs_to_backend'] == sam.compiles['dynamo_frames'] == 1
    assert sam.compiles['graph_breaks'] == 0


@pytest.mark.parametrize('backend', BACKENDS)
def test_compiled_sam_weights_equal_eager_sam(runs, backend):
    """Same masks as eager needs eager's random ops: inductor draws dropout with its own generator code unless
    ``fallback_random`` (aot_eager runs aten's ops, so it always does)."""
    compiled = runs('samadamw', backend, fallback_random=True)
    eager = runs('samadamw', None)
    distance = _relative_distance(compiled.model, eager.model)
    print(f'{backend}: relative weight distance to eager SAM {distance:.2e}')
    assert distance <= WEIGHT_RTOL, f'{backend}: ||w_compiled - w_eager|| / ||w_eager - w_0|| = {distance:.2e}'
    # the yardstick tells the errors it guards against: no ascent (AdamW), a second pass with other masks
    assert _relative_distance(runs('adamw', None).model, eager.model) > 10 * WEIGHT_RTOL
    assert _relative_distance(runs('samadamw', backend, fallback_random=True, restore_rng=False).model,
                              eager.model) > 10 * WEIGHT_RTOL


@pytest.mark.parametrize('backend', BACKENDS)
def test_both_compiled_passes_draw_the_same_masks(runs, backend):
    """rho = 0: w + e = w, so the second pass is the first again if, and only if, it draws the same dropout and
    drop-path masks; SAM then steps bit-exactly as the compiled AdamW loop (and the fork leaves the generator as
    AdamW's run leaves it, so the later steps match too). With inductor this is its own random code (no
    ``fallback_random``): its seeds come from the CPU generator, which SAM restores."""
    sam, adamw = runs('samadamw', backend, rho=0.0), runs('adamw', backend)
    for (name, p), q in zip(sam.model.named_parameters(), adamw.model.parameters()):
        assert torch.equal(p, q), name
    forward = torch.compile(_vit(), backend=backend)
    x = torch.randn(2, 3, 32, 32)
    assert not torch.equal(forward(x), forward(x))  # the masks are live: two draws differ
    torch._dynamo.reset()
