"""torchrun's command line on one node or several, from the command line or SLURM's environment, and every refusal.

The library (:func:`resolve_launch`, :func:`expand_nodelist`) is tested with the environment given as a dict;
``timm-ext train --print-command`` with SLURM variables set by the test and timm's real train.py (from
TIMM_EXT_TIMM_TRAIN, default ../shared/timm-train/v1.0.28; skipped when absent). Nothing starts a process.
"""
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch
from _cli import run_cli, train_py_argv
from _timm_train import SCRIPTS_DIR, TRAIN_PY
from conftest import require_timm_script

from timm_ext.launch.distributed import Launch, LaunchError, expand_nodelist, resolve_launch
from timm_ext.recipes import recipes_dir

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, '-m', 'torch.distributed.run']
RECIPE = REPO / 'recipes' / 'vit-sam' / 'imagenet' / 'vit_s16_sam.yaml'

SLURM_4X8 = {'SLURM_JOB_ID': '4242', 'SLURM_JOB_NUM_NODES': '4', 'SLURM_NODEID': '2',
             'SLURM_JOB_NODELIST': 'gpu[07-08,10],hpc3', 'SLURM_GPUS_ON_NODE': '8', 'SLURM_NTASKS_PER_NODE': '1'}


@pytest.fixture(autouse=True)
def _no_slurm(monkeypatch):
    """No SLURM variable of the machine running the tests leaks in; a test sets its own."""
    for name in list(os.environ):
        if name.startswith('SLURM_'):
            monkeypatch.delenv(name)


def refusal(**kwargs):
    with pytest.raises(LaunchError) as e:
        resolve_launch(**kwargs)
    return str(e.value).splitlines()


# --- expand_nodelist ---------------------------------------------------------------------------------

@pytest.mark.parametrize('nodelist, hosts', [
    ('gpu01', ['gpu01']),
    ('gpu[01-04,07]', ['gpu01', 'gpu02', 'gpu03', 'gpu04', 'gpu07']),
    ('a[1-2],b3', ['a1', 'a2', 'b3']),
    ('b3,a[1-2]', ['b3', 'a1', 'a2']),  # SLURM's order, not sorted
    ('n[8-10]', ['n8', 'n9', 'n10']),
    ('n[008-010]', ['n008', 'n009', 'n010']),  # zero padding kept, as wide as the first number
    ('rack[1-2]-n[01-02]', ['rack1-n01', 'rack1-n02', 'rack2-n01', 'rack2-n02']),
    ('x[1]y,z[5,3]', ['x1y', 'z5', 'z3']),
    ('node-1.cluster,node-2.cluster', ['node-1.cluster', 'node-2.cluster']),
])
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize('nodelist, message', [
    ('a[1-2', "node list 'a[1-2': unbalanced brackets in 'a[1-2'"),
    ('a]1', "node list 'a]1': unbalanced brackets in 'a]1'"),
    ('a[x]', "node list 'a[x]': 'x' in [x] is not a number or a range N-M"),
    ('a[1-]', "node list 'a[1-]': '1-' in [1-] is not a number or a range N-M"),
    ('a[3-1]', "node list 'a[3-1]': the range '3-1' in [3-1] runs backwards"),
    ('a,,b', "node list 'a,,b' has an empty host name"),
])
def test_expand_nodelist_refuses(nodelist, message):
    with pytest.raises(LaunchError) as e:
        expand_nodelist(nodelist)
    assert str(e.value) == message


# --- the command line's values --------------------------------------------------------------------

def test_no_torchrun_without_processes_or_nodes():
    assert resolve_launch() is None
    assert resolve_launch(environ={'SLURM_JOB_ID': '7', 'SLURM_JOB_NUM_NODES': '1', 'SLURM_GPUS_ON_NODE': '8'}) is None


def test_one_node_is_standalone():
    launch = resolve_launch(nproc_per_node=8)
    assert launch == Launch(8) and launch.world_size == 8 and launch.standalone
    assert launch.torchrun_args() == ['--standalone', '--nproc-per-node=8']
    assert resolve_launch(nproc_per_node=2, nnodes='1', max_restarts=3).torchrun_args() == [
        '--standalone', '--nproc-per-node=2', '--max-restarts=3']


def test_several_nodes():
    launch = resolve_launch(nproc_per_node=8, nnodes='4', node_rank=3, rdzv_endpoint='node01:29400', rdzv_id='job7',
                            max_restarts=0)
    assert launch.world_size == 32 and not launch.standalone
    assert launch.torchrun_args() == ['--nnodes=4', '--nproc-per-node=8', '--rdzv-backend=c10d',
                                      '--rdzv-endpoint=node01:29400', '--rdzv-id=job7', '--node-rank=3',
                                      '--max-restarts=0']
    launch = resolve_launch(nproc_per_node=4, nnodes='2', rdzv_endpoint='10.0.0.1:1234')
    assert launch.torchrun_args() == ['--nnodes=2', '--nproc-per-node=4', '--rdzv-backend=c10d',
                                      '--rdzv-endpoint=10.0.0.1:1234']


def test_elastic_nodes_count_the_maximum():
    launch = resolve_launch(nproc_per_node=8, nnodes='2:4', rdzv_endpoint='[fe80::1]:29500', rdzv_backend='etcd')
    assert launch.world_size == 32 and launch.max_nodes == 4
    assert launch.torchrun_args() == ['--nnodes=2:4', '--nproc-per-node=8', '--rdzv-backend=etcd',
                                      '--rdzv-endpoint=[fe80::1]:29500']


def test_one_node_with_an_endpoint_and_static_backend():
    launch = resolve_launch(nproc_per_node=2, rdzv_endpoint='host:29500', rdzv_id='x', node_rank=0)
    assert launch.torchrun_args() == ['--nnodes=1', '--nproc-per-node=2', '--rdzv-backend=c10d',
                                      '--rdzv-endpoint=host:29500', '--rdzv-id=x', '--node-rank=0']
    static = resolve_launch(nproc_per_node=8, nnodes='2', node_rank=1, rdzv_endpoint='h:1', rdzv_backend='static')
    assert static.torchrun_args() == ['--nnodes=2', '--nproc-per-node=8', '--rdzv-backend=static',
                                      '--rdzv-endpoint=h:1', '--node-rank=1']


@pytest.mark.parametrize('kwargs, lines', [
    (dict(nproc_per_node=0), ['--nproc-per-node must be at least 1, got 0']),
    (dict(nproc_per_node=8, nnodes='4', node_rank=4, rdzv_endpoint='h:29500'),
     ['--node-rank 4 is outside the nodes 0..3 of --nnodes 4: give each node its own rank from 0 to 3']),
    (dict(nproc_per_node=8, nnodes='4', node_rank=-1, rdzv_endpoint='h:29500'),
     ['--node-rank -1 is outside the nodes 0..3 of --nnodes 4: give each node its own rank from 0 to 3']),
    (dict(nproc_per_node=8, nnodes='4'),
     ['--nnodes 4 needs --rdzv-endpoint HOST:PORT, the same on every node (a host of the job and a free port, e.g. '
      'the first node:29500)']),
    (dict(nproc_per_node=8, nnodes='0'), ['--nnodes 0 must be at least 1 node']),
    (dict(nproc_per_node=8, nnodes='3:2', rdzv_endpoint='h:1'),
     ['--nnodes 3:2: MIN 3 is above MAX 2; give MIN:MAX with MIN <= MAX, e.g. 2:3']),
    (dict(nproc_per_node=8, nnodes='a'),
     ["--nnodes 'a' is not a node count: give N or MIN:MAX (elastic), e.g. --nnodes 4 or 2:4"]),
    (dict(nproc_per_node=8, nnodes='1:2:3', node_rank=1),
     ["--nnodes '1:2:3' is not a node count: give N or MIN:MAX (elastic), e.g. --nnodes 4 or 2:4"]),
    (dict(nproc_per_node=8, nnodes='2', rdzv_endpoint='node01'),
     ["--rdzv-endpoint 'node01' needs HOST:PORT (the first node's address and a free port, e.g. node01:29500)"]),
    (dict(nproc_per_node=8, nnodes='2', rdzv_endpoint=':29500'),
     ["--rdzv-endpoint ':29500' needs HOST:PORT (the first node's address and a free port, e.g. node01:29500)"]),
    (dict(nproc_per_node=8, nnodes='2', rdzv_endpoint='node01:0'),
     ["--rdzv-endpoint 'node01:0': the port must be a number from 1 to 65535, e.g. node01:29500"]),
    (dict(nproc_per_node=8, nnodes='2', rdzv_endpoint='node01:65536'),
     ["--rdzv-endpoint 'node01:65536': the port must be a number from 1 to 65535, e.g. node01:29500"]),
    (dict(nproc_per_node=8, nnodes='2', rdzv_endpoint='node01:http'),
     ["--rdzv-endpoint 'node01:http': the port must be a number from 1 to 65535, e.g. node01:29500"]),
    (dict(nnodes='2', rdzv_endpoint='h:1'),
     ['--nnodes 2 needs --nproc-per-node N, the processes on each node (usually its GPU count)']),
    (dict(nproc_per_node=8, max_restarts=-1), ['--max-restarts must be 0 or more, got -1']),
    (dict(max_restarts=2), ["--max-restarts 2 restarts torchrun's workers: add --nproc-per-node N"]),
    (dict(rdzv_endpoint='h:1', rdzv_id='x'),
     ["--rdzv-endpoint h:1 is torchrun's: add --nproc-per-node N (and --nnodes N for several nodes)"]),
    (dict(nproc_per_node=8, nnodes='2', rdzv_endpoint='h:1', rdzv_backend='static'),
     ['--rdzv-backend static needs a fixed --nnodes N and --node-rank on every node (got --nnodes 2, no '
      '--node-rank); the default c10d assigns the ranks itself']),
    (dict(nproc_per_node=8, nnodes='1:2', node_rank=0, rdzv_endpoint='h:1', rdzv_backend='static'),
     ['--rdzv-backend static needs a fixed --nnodes N and --node-rank on every node (got --nnodes 1:2); the default '
      'c10d assigns the ranks itself']),
])
def test_refusals(kwargs, lines):
    assert refusal(**kwargs) == lines


@pytest.mark.parametrize('flag, kwargs', [
    ('--node-rank 1', dict(node_rank=1)), ('--rdzv-id job', dict(rdzv_id='job')),
    ('--rdzv-backend c10d', dict(rdzv_backend='c10d')),
])
def test_rendezvous_arguments_need_several_nodes(flag, kwargs):
    line = (f'{flag} needs several nodes: add --nnodes N (N > 1) and --rdzv-endpoint HOST:PORT; one node runs torchrun '
            f'--standalone, which ignores it')
    assert refusal(**kwargs) == [line]  # no torchrun at all
    assert refusal(nproc_per_node=8, **kwargs) == [line]
    assert refusal(nproc_per_node=8, nnodes='1', **kwargs) == [line]


def test_every_problem_at_once():
    assert refusal(nproc_per_node=0, nnodes='4', node_rank=7, max_restarts=-2) == [
        '--nproc-per-node must be at least 1, got 0',
        '--nnodes 4 needs --rdzv-endpoint HOST:PORT, the same on every node (a host of the job and a free port, e.g. '
        'the first node:29500)',
        '--node-rank 7 is outside the nodes 0..3 of --nnodes 4: give each node its own rank from 0 to 3',
        '--max-restarts must be 0 or more, got -2']


# --- SLURM ---------------------------------------------------------------------------------------------

def test_slurm_several_nodes():
    """Nodes, rendezvous host (the first of the list), job id and GPUs from SLURM; c10d assigns the ranks, so every
    node runs the same command and SLURM_NODEID is only checked."""
    launch = resolve_launch(environ=SLURM_4X8)
    assert launch.world_size == 32
    assert launch.torchrun_args() == ['--nnodes=4', '--nproc-per-node=8', '--rdzv-backend=c10d',
                                      '--rdzv-endpoint=gpu07:29500', '--rdzv-id=4242']
    assert launch.notes == ('SLURM job 4242: rendezvous at gpu07:29500, the first host of SLURM_JOB_NODELIST (port '
                            '29500 by default; --rdzv-endpoint HOST:PORT sets another)',)
    assert resolve_launch(nproc_per_node=4, environ=SLURM_4X8).world_size == 16  # the command line wins


def test_slurm_other_names_and_given_values():
    env = {'SLURM_JOB_ID': '9', 'SLURM_NNODES': '2', 'SLURM_NODEID': '1', 'SLURM_NODELIST': 'rack[3-4]-n[09-10]',
           'SLURM_GPUS_PER_NODE': 'a100:4'}
    launch = resolve_launch(environ=env)
    assert launch.torchrun_args() == ['--nnodes=2', '--nproc-per-node=4', '--rdzv-backend=c10d',
                                      '--rdzv-endpoint=rack3-n09:29500', '--rdzv-id=9']
    assert 'the first host of SLURM_NODELIST' in launch.notes[0]
    launch = resolve_launch(nproc_per_node=2, rdzv_endpoint='login:5000', rdzv_id='mine', rdzv_backend='static',
                            environ=env)
    assert launch.torchrun_args() == ['--nnodes=2', '--nproc-per-node=2', '--rdzv-backend=static',
                                      '--rdzv-endpoint=login:5000', '--rdzv-id=mine', '--node-rank=1']
    assert launch.notes == ()
    for gpus in ('8', 'gpu:a100:8'):
        assert resolve_launch(environ=dict(env, SLURM_GPUS_PER_NODE=gpus)).nproc_per_node == 8


def test_slurm_one_node():
    """One node: torchrun --standalone with the processes asked for; without them train.py runs as one process."""
    env = {'SLURM_JOB_ID': '5', 'SLURM_JOB_NUM_NODES': '1', 'SLURM_NODEID': '0', 'SLURM_JOB_NODELIST': 'gpu01',
           'SLURM_GPUS_ON_NODE': '4'}
    assert resolve_launch(nproc_per_node=4, environ=env).torchrun_args() == ['--standalone', '--nproc-per-node=4']
    assert resolve_launch(nnodes='1', environ=env).torchrun_args() == ['--standalone', '--nproc-per-node=4']
    assert resolve_launch(environ=env) is None


@pytest.mark.parametrize('env, lines', [
    (dict(SLURM_4X8, SLURM_NTASKS_PER_NODE='8'),
     ['SLURM_NTASKS_PER_NODE is 8: timm-ext train starts torchrun, which starts the --nproc-per-node processes of '
      'its node itself, so it needs one task per node; run it with srun --ntasks-per-node=1 (with 8 tasks each node '
      'would start 8 torchruns)']),
    ({k: v for k, v in SLURM_4X8.items() if k != 'SLURM_GPUS_ON_NODE'},
     ['SLURM_JOB_NUM_NODES 4 needs --nproc-per-node N, the processes on each node (usually its GPU count); this '
      'SLURM job sets no SLURM_GPUS_ON_NODE or SLURM_GPUS_PER_NODE']),
    (dict(SLURM_4X8, SLURM_NODEID='4'),
     ['SLURM_NODEID 4 is outside the nodes 0..3 of SLURM_JOB_NUM_NODES 4: give each node its own rank from 0 to 3']),
    (dict(SLURM_4X8, SLURM_JOB_NODELIST='gpu[01-'),
     ["SLURM_JOB_NODELIST: node list 'gpu[01-': unbalanced brackets in 'gpu[01-'; pass --rdzv-endpoint HOST:PORT "
      "(the first node and a free port)"]),
    ({k: v for k, v in SLURM_4X8.items() if k != 'SLURM_JOB_NODELIST'},
     ['SLURM_JOB_ID is set but neither SLURM_JOB_NODELIST nor SLURM_NODELIST: pass --rdzv-endpoint HOST:PORT (a '
      'host of the job and a free port such as 29500)']),
    (dict(SLURM_4X8, SLURM_JOB_NUM_NODES='many'),
     ["SLURM_JOB_NUM_NODES='many' is not a whole number: pass --nnodes N"]),
    (dict(SLURM_4X8, SLURM_NODEID='x'), ["SLURM_NODEID='x' is not a whole number: pass --node-rank R"]),
    (dict(SLURM_4X8, SLURM_GPUS_ON_NODE='eight'),
     ["SLURM_GPUS_ON_NODE='eight' is not a whole number: pass --nproc-per-node N"]),
    (dict(SLURM_4X8, SLURM_GPUS_ON_NODE='', SLURM_GPUS_PER_NODE='a100:4,v100:2'),
     ["SLURM_GPUS_PER_NODE='a100:4,v100:2' is not a GPU count (N or TYPE:N): pass --nproc-per-node N"]),
])
def test_slurm_refusals(env, lines):
    assert refusal(environ=env) == lines


def test_slurm_several_tasks_refused_only_for_torchrun():
    env = dict(SLURM_JOB_ID='3', SLURM_JOB_NUM_NODES='1', SLURM_NTASKS_PER_NODE='4')
    assert resolve_launch(environ=env) is None  # plain python train.py, as without SLURM
    assert refusal(nproc_per_node=4, environ=env)[0].startswith('SLURM_NTASKS_PER_NODE is 4: ')


# --- timm-ext train --print-command ---------------------------------------------------------------

@pytest.fixture
def timm_scripts(offline_scripts, monkeypatch):
    require_timm_script(TRAIN_PY)
    monkeypatch.setenv('TIMM_EXT_TIMM_TRAIN', str(SCRIPTS_DIR))


def _errors(err):
    lines = [line for line in err.splitlines() if not line.startswith('timm-ext: note:')]
    assert all(line.startswith('timm-ext train: error: ') for line in lines), err
    return [line[len('timm-ext train: error: '):] for line in lines]


def test_print_command_is_dry_run(capsys, timm_scripts):
    args = ['train', '--no-check', '--device', 'cuda', '--nproc-per-node', '8', '--nnodes', '2:4', '--node-rank', '1',
            '--rdzv-endpoint', 'node01:29400', '--rdzv-id', 'run 1', '--max-restarts', '3']
    code, out, err = run_cli(capsys, *args, '--print-command')
    assert code == 0 and _errors(err) == [] and out.count('\n') == 1
    assert shlex.split(out) == [*TORCHRUN, '--nnodes=2:4', '--nproc-per-node=8', '--rdzv-backend=c10d',
                                '--rdzv-endpoint=node01:29400', '--rdzv-id=run 1', '--node-rank=1', '--max-restarts=3',
                                *train_py_argv(TRAIN_PY), '--device', 'cuda', '--device-modules', 'timm_ext']
    assert run_cli(capsys, *args, '--dry-run')[1] == out


def test_print_command_refusals_are_one_line_each(capsys, timm_scripts):
    code, out, err = run_cli(capsys, 'train', '--no-check', '--nproc-per-node', '8', '--nnodes', '4', '--node-rank',
                             '4', '--print-command')
    assert code == 2 and out == '' and _errors(err) == [
        '--nnodes 4 needs --rdzv-endpoint HOST:PORT, the same on every node (a host of the job and a free port, e.g. '
        'the first node:29500)',
        '--node-rank 4 is outside the nodes 0..3 of --nnodes 4: give each node its own rank from 0 to 3']


def test_help_names_what_goes_to_torchrun(capsys):
    code, out, _ = run_cli(capsys, 'train', '--help')
    text = ' '.join(out.split())
    assert code == 0 and 'passed on to python -m torch.distributed.run (torchrun) under the same names' in text
    for flag in ('--nproc-per-node', '--nnodes', '--node-rank', '--rdzv-endpoint', '--rdzv-id', '--rdzv-backend',
                 '--max-restarts'):
        assert flag in out
    assert '--dry-run, --print-command' in text


@pytest.fixture
def cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)


def test_slurm_job_of_four_nodes_with_the_checks(capsys, timm_scripts, cuda, tmp_path, monkeypatch):
    """The docs' sbatch command on node 0 of a 4 x 8 GPU job, checked (32 processes, 1 accumulation step)."""
    import io

    from PIL import Image

    png = io.BytesIO()
    Image.new('RGB', (8, 8)).save(png, format='PNG')
    for split, count in (('train', 5), ('validation', 1)):  # 1000 classes (the model's head): 5000 >= 32 x 127 + 1
        for k in range(1000 if split == 'train' else 1):
            (tmp_path / 'imagenet' / split / f'c{k}').mkdir(parents=True)
            for i in range(count):
                (tmp_path / 'imagenet' / split / f'c{k}' / f'{i}.png').write_bytes(png.getvalue())
    for name, value in dict(SLURM_4X8, SLURM_NODEID='0', SLURM_JOB_NODELIST='gpu[01-04]').items():
        monkeypatch.setenv(name, value)
    code, out, err = run_cli(capsys, 'train', '-c', 'vit-sam/imagenet/vit_s16_sam', '--nproc-per-node', '8',
                             '--grad-accum-steps', 'auto', '--data-dir', tmp_path / 'imagenet', '--print-command')
    assert code == 0, err
    assert shlex.split(out) == [*TORCHRUN, '--nnodes=4', '--nproc-per-node=8', '--rdzv-backend=c10d',
                                '--rdzv-endpoint=gpu01:29500', '--rdzv-id=4242', *train_py_argv(TRAIN_PY), '-c',
                                str(RECIPE), '--grad-accum-steps', '1', '--data-dir', str(tmp_path / 'imagenet')]
    assert [line for line in err.splitlines() if not line.startswith('timm-ext: note:')] == [
        'timm-ext train: SLURM job 4242: rendezvous at gpu01:29500, the first host of SLURM_JOB_NODELIST (port 29500 '
        'by default; --rdzv-endpoint HOST:PORT sets another)',
        'timm-ext train: global batch 4096 = 128 per process x 32 processes x 1 accumulation step (--grad-accum-steps '
        'auto: recipe vit-sam/imagenet/vit_s16_sam, vit-sam Table 2); lr 0.003 unchanged: train.py does not rescale '
        'an explicit lr']


def _docs_places():
    """This machine's paths and the docs' placeholders for them. The docs show the newest timm's line; on timm < 1.0.29
    the printed line starts train.py through a runner (release-aware: tests/_cli.py), shown as train.py itself."""
    return {' '.join(train_py_argv(TRAIN_PY)): '/path/to/train.py', sys.executable: '/path/to/venv/bin/python',
            str(TRAIN_PY): '/path/to/train.py', str(recipes_dir()): '/path/to/timm_ext/_recipes'}


def test_docs_sbatch_script_prints_the_documented_line(capsys, timm_scripts, monkeypatch):
    """docs/cli.md's sbatch script: its ``timm-ext train`` line, run with the job's SLURM variables on node 0,
    prints the line the docs show (paths of this machine replaced by the docs' placeholders)."""
    text = (REPO / 'docs' / 'cli.md').read_text()
    script = re.search(r'```bash\n(#!/bin/bash\n#SBATCH.*?)```', text, flags=re.S).group(1)
    assert re.search(r'^#SBATCH --nodes=4$', script, flags=re.M)
    assert re.search(r'^#SBATCH --ntasks-per-node=1$', script, flags=re.M)
    assert re.search(r'^#SBATCH --gpus-per-node=8$', script, flags=re.M)
    command = next(line for line in script.replace('\\\n', ' ').splitlines() if line.startswith('srun '))
    argv = shlex.split(command, comments=True)
    train = argv[argv.index('timm-ext') + 1:]
    assert '--ntasks-per-node=1' in argv[:argv.index('timm-ext')]
    shown = re.search(r'prints, on node 0:\n\n```text\n(.*?)\n```', text, flags=re.S).group(1)
    for name, value in dict(SLURM_4X8, SLURM_NODEID='0', SLURM_JOB_ID='123456',
                            SLURM_JOB_NODELIST='gpu[01-04]').items():
        monkeypatch.setenv(name, value)
    code, out, err = run_cli(capsys, *train, '--print-command', '--no-check')
    assert code == 0, err
    places = _docs_places()
    for here, placeholder in places.items():
        out = out.replace(here, placeholder)
    assert out == shown + '\n'


def test_docs_per_node_and_login_node_examples(capsys, timm_scripts, monkeypatch):
    """The ``sh`` examples of docs/cli.md's "Several nodes" section: the per-node command builds a 4-node torchrun
    line, and the login-node one (its SLURM variables as written) prints the documented line."""
    text = (REPO / 'docs' / 'cli.md').read_text()
    section = text[text.index('### Several nodes (torchrun, SLURM)'):text.index('## `timm-ext validate`')]
    blocks = re.findall(r'```sh\n(.*?)```', section, flags=re.S)
    assert len(blocks) == 2
    lines = [shlex.split(b.replace('\\\n', ' ').strip(), comments=True) for b in blocks]
    per_node, login = lines
    code, out, err = run_cli(capsys, *per_node[1:], '--no-check', '--print-command')
    assert code == 0, err
    assert shlex.split(out)[3:9] == ['--nnodes=4', '--nproc-per-node=8', '--rdzv-backend=c10d',
                                     '--rdzv-endpoint=node01:29500', '--rdzv-id=vit-s16-sam', '--node-rank=0']
    assert shlex.split(out)[-4:] == ['--grad-accum-steps', '1', '--data-dir', '/data/imagenet']
    env = dict(a.split('=', 1) for a in login[:login.index('timm-ext')])
    assert set(env) == {'SLURM_JOB_ID', 'SLURM_JOB_NUM_NODES', 'SLURM_NODEID', 'SLURM_JOB_NODELIST'}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = run_cli(capsys, *login[login.index('timm-ext') + 1:])
    assert code == 0, err
    shown = re.search(r'prints, on node 0:\n\n```text\n(.*?)\n```', section, flags=re.S).group(1)
    places = _docs_places()
    for here, placeholder in places.items():
        out = out.replace(here, placeholder)
    assert out == shown + '\n'
