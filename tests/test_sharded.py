"""SAM over FSDP2 (``torch.distributed.fsdp.fully_shard``) on 2 gloo processes: every family equal to one process on
the whole batch, a resume through ``torch.distributed.checkpoint``, the extra memory of one shard copy, and the
one-line refusal of what cannot be exact (m-sharpness across sharded workers, FSDP1's flat parameters)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from timm_ext.optim import SAM

fsdp = pytest.importorskip('torch.distributed.fsdp', reason='FSDP2 needs torch.distributed')
if not hasattr(fsdp, 'fully_shard'):
    pytest.skip('torch.distributed.fsdp.fully_shard (FSDP2) needs torch >= 2.6', allow_module_level=True)
from _fsdp2_worker import FAMILIES, batches, full_weights, optimizer_for, small_model, train  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason='needs torch.distributed (gloo)')
WORKER = Path(__file__).with_name('_fsdp2_worker.py')


@pytest.fixture(scope='module')
def sharded_runs(tmp_path_factory):
    """Both ranks in fresh interpreters, launched as a user launches them (torchrun)."""
    out = tmp_path_factory.mktemp('fsdp2')
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=str(WORKER.parent.parent))
    proc = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node', '2',
                           str(WORKER), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / 'results.json').read_text())


@pytest.mark.parametrize('name', list(FAMILIES))
def test_two_sharded_processes_equal_one_process_on_the_whole_batch(sharded_runs, name):
    model = small_model()
    train(model, optimizer_for(name, model), batches())
    sharded = [torch.tensor(t) for t in sharded_runs[name]]
    diff = max((a - b).abs().max().item() for a, b in zip(full_weights(model), sharded))
    assert diff <= 1e-5, f'{name}: max |diff| {diff:.2e}'
    moved = max((a - b).abs().max().item() for a, b in zip(full_weights(small_model()), sharded))
    assert moved > 1e-2  # it trained


@pytest.mark.parametrize('name', ['sam', 'looksam', 'gsam'])
def test_resume_from_a_sharded_checkpoint_continues_exactly(sharded_runs, name):
    """torch.distributed.checkpoint keeps only state and param_groups: SAM's settings and step count travel in the
    groups, LookSAM's g_v in the per-parameter state (sharded); the fresh optimizer's defaults are replaced."""
    uninterrupted = [torch.tensor(t) for t in sharded_runs[name]]
    resumed = [torch.tensor(t) for t in sharded_runs[f'resumed_{name}']]
    diff = max((a - b).abs().max().item() for a, b in zip(uninterrupted, resumed))
    assert diff <= 1e-6, f'{name}: max |diff| {diff:.2e}'


def test_extra_memory_is_one_copy_of_the_rank_shard(sharded_runs):
    assert sharded_runs['extra_memory_shards'] == pytest.approx(1.0)


def test_m_sharpness_across_sharded_workers_is_refused_before_any_update(sharded_runs):
    assert sharded_runs['m_sharpness'] == (
        'SAM m_sharpness=2 under FSDP2 (fully_shard) needs each worker to perturb with its own gradient, but the '
        'workers share one sharded copy of the weights: train m-sharpness with DDP, or leave m_sharpness unset')
    assert sharded_runs['m_sharpness_untouched']


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='FSDP1 needs an accelerator (it refuses the CPU)')
@pytest.mark.parametrize('use_orig_params', [False, True])
def test_fsdp1_flat_parameters_are_refused_when_sam_is_built(use_orig_params, tmp_path):
    from torch.distributed.fsdp import FullyShardedDataParallel
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/pg', rank=0, world_size=1)
    try:
        flat = FullyShardedDataParallel(small_model().cuda(), use_orig_params=use_orig_params)
        with pytest.raises(ValueError, match=r'^SAM cannot perturb FSDP1 \(FullyShardedDataParallel\) flat parameters'):
            SAM(torch.optim.SGD(flat.parameters(), lr=0.1))
    finally:
        dist.destroy_process_group()
