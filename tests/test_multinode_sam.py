"""SAM across nodes: a real two-"node" torchrun job on this machine equals one process on the whole batch.

Two launchers ``python -m torch.distributed.run --nnodes 2 --node-rank 0|1 --nproc-per-node 1 --rdzv-backend c10d
--rdzv-endpoint 127.0.0.1:PORT --rdzv-id ID --max-restarts 0`` run side by side: torchrun's own flags, the same
ones ``timm-ext train --nnodes`` passes on. Each node has one process, so both workers have LOCAL_RANK 0 and
LOCAL_WORLD_SIZE 1 while RANK is 0 and 1 and WORLD_SIZE is 2: anything that took the rank or the world size from
the node would pick the same half of the batch, or skip the all-reduce, and drift from the reference. (Under
c10d torchrun ignores ``--node-rank``, with a warning: the rendezvous assigns the global ranks.)

The workers (tests/_multinode_worker.py) drive timm's ``ClassificationTask`` in DDP directly: timm's train.py
itself cannot run DDP on the CPU (v1.0.28 passes ``device_ids=[device]``, which torch refuses for CPU modules).
"""
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

TESTS = Path(__file__).resolve().parent
LAUNCH_TIMEOUT_S = 180  # the whole run takes 12-27 s on 2 busy cores; a hang fails here, and is killed
pytestmark = [
    pytest.mark.skipif(not dist.is_available(), reason='torch.distributed is not available in this torch build'),
    pytest.mark.skipif(dist.is_available() and not dist.is_gloo_available(),
                       reason='the gloo backend of torch.distributed is not available in this torch build'),
    pytest.mark.filterwarnings('ignore:SAM does not know the model'),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _launcher(node_rank: int, port: int, run_id: str, out: Path) -> subprocess.Popen:
    command = [sys.executable, '-m', 'torch.distributed.run', '--nnodes', '2', '--node-rank', str(node_rank),
               '--nproc-per-node', '1', '--rdzv-backend', 'c10d', '--rdzv-endpoint', f'127.0.0.1:{port}',
               '--rdzv-id', run_id, '--max-restarts', '0', str(TESTS / '_multinode_worker.py'), str(out)]
    env = dict(os.environ, OMP_NUM_THREADS='1', HF_HUB_OFFLINE='1', PYTHONUNBUFFERED='1')
    log = open(out / f'node{node_rank}.log', 'w')
    try:  # its own session: killpg ends the launcher and anything left in its group
        return subprocess.Popen(command, cwd=TESTS.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    finally:
        log.close()


def _stop(launcher: subprocess.Popen) -> None:
    """SIGTERM first (torchrun then stops its workers), SIGKILL for whatever is left of the launcher's group."""
    if launcher.poll() is None:
        try:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    launcher.wait(timeout=15)


def _kill_workers(out: Path) -> None:
    """torchrun starts each worker in a session of its own: kill any still running (by the pid it wrote)."""
    for pid_file in out.glob('worker-*.pid'):
        pid = int(pid_file.read_text())
        try:
            cmdline = Path(f'/proc/{pid}/cmdline').read_bytes()
        except OSError:
            continue  # gone
        if b'_multinode_worker.py' in cmdline:
            os.kill(pid, signal.SIGKILL)


def _run_two_nodes(out: Path) -> None:
    port, run_id = _free_port(), f'timm-ext-test-{uuid.uuid4().hex[:8]}'
    launchers = []
    try:
        launchers = [_launcher(node_rank, port, run_id, out) for node_rank in (0, 1)]
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        try:
            codes = [launcher.wait(timeout=max(0.1, deadline - time.monotonic())) for launcher in launchers]
        except subprocess.TimeoutExpired:
            codes = None
    finally:
        for launcher in launchers:
            _stop(launcher)
        _kill_workers(out)
    logs = '\n'.join((out / f'node{n}.log').read_text()[-3000:] for n in (0, 1))
    assert codes is not None, f'the two-node run did not finish within {LAUNCH_TIMEOUT_S} s (stopped):\n{logs}'
    assert codes == [0, 0], f'torchrun exited with {codes}:\n{logs}'


@pytest.mark.slow  # 4 processes importing torch and timm: 12-27 s on 2 busy cores
def test_two_node_torchrun_sam_equals_one_process_on_the_whole_batch(tmp_path):
    from _multinode_worker import M_SHARPNESS, RUNS, train

    _run_two_nodes(tmp_path)
    ranks = [torch.load(tmp_path / f'rank{r}.pt') for r in (0, 1)]

    # two nodes of one process each: the global rank and world size are not the node's
    for rank, result in enumerate(ranks):
        assert result['env'] == {'RANK': str(rank), 'LOCAL_RANK': '0', 'WORLD_SIZE': '2', 'LOCAL_WORLD_SIZE': '1',
                                 'GROUP_RANK': str(rank), 'GROUP_WORLD_SIZE': '2'}
    for m in RUNS:
        key = f'm={m}'
        assert torch.equal(ranks[0][key], ranks[1][key]), f'{key}: the two nodes\' replicas differ'
        # One process on all 16 images with the same m_sharpness (images per chunk) cuts 4 chunks, the two nodes
        # 2 each: the same chunks, and the all-reduced mean of the nodes' chunk means is the mean over all 4. What
        # differs is float32 summation order only (two 8-image means averaged vs one 16-image mean; measured 6e-8,
        # 2 ulps for weights in [0.25, 0.5)): 1e-6 allows ~30 ulps and is 1e5 times below the m_sharpness gap.
        torch.testing.assert_close(ranks[0][key], train(m, world_size=1), rtol=0, atol=1e-6)
    gap = (ranks[0][f'm={M_SHARPNESS}'] - ranks[0]['m=None']).abs().max()
    assert gap > 1e-2, f'm_sharpness={M_SHARPNESS} changed the weights by only {gap:.2e}'
