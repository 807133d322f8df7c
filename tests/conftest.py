"""Shared test setup: offline hub, deterministic seeds, and the path to timm's real train.py."""
import itertools
import json
import os

os.environ.setdefault('HF_HUB_OFFLINE', '1')

import pytest  # noqa: E402
import torch  # noqa: E402
from _cuda import device  # noqa: E402, F401  (the `cuda` tests' device fixture: cuda, or cpu by TIMM_EXT_CUDA_TESTS_ON)
from _timm_free import register as register_timm_free  # noqa: E402

pytest_plugins = ('pytester',)  # test_ci_lanes.py runs a pytest of its own over a marked test

_CACHES = itertools.count()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _private_timm_ext_cache(tmp_path_factory, monkeypatch):
    """Each test its own timm-ext cache (made only when written): a train.py given by path is cached there,
    never in ~/.cache/timm-ext, and no test sees what an earlier one cached."""
    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path_factory.getbasetemp() / 'timm-ext-cache' / str(next(_CACHES))))


@pytest.fixture
def offline_scripts(tmp_path, monkeypatch):
    """A private timm-ext cache, no $TIMM_EXT_TIMM_TRAIN, and a network that fails the test if touched (a download,
    or the doctor's question whether one would work)."""
    from timm_ext.launch import timm_scripts

    monkeypatch.setenv('TIMM_EXT_CACHE', str(tmp_path / 'cache'))
    monkeypatch.delenv('TIMM_EXT_TIMM_TRAIN', raising=False)

    def no_network(url, timeout=30.0):
        raise AssertionError(f'the test went to the network: {url}')

    def no_probe(url, timeout=None):
        pytest.fail(f'the test asked the network: {url}')  # not an Exception: download_problems raises it on

    monkeypatch.setattr(timm_scripts, 'fetch_url', no_network)
    monkeypatch.setattr(timm_scripts, 'probe_url', no_probe)


@pytest.fixture
def eager_kron(monkeypatch):
    """timm's Kron compiles its preconditioner updates with inductor at its first step (12 s on 2 CPU cores, once per
    process); a test that steps every timm optimizer under SAM runs Kron's eager path (the module flag it reads)."""
    import timm.optim.kron as kron

    if hasattr(kron, 'has_dynamo'):
        monkeypatch.setattr(kron, 'has_dynamo', False)


def require_timm_script(path):
    """Skip unless timm's script at ``path`` exists and imports with the installed timm (v1.0.28's needs >= 1.0.28)."""
    from timm_ext.launch.timm_scripts import ScriptError, load_script_parser

    if not path.is_file():
        pytest.skip(f'timm\'s script not found at {path} (set TIMM_EXT_TIMM_TRAIN)')
    try:
        return load_script_parser(path)
    except ScriptError as e:
        pytest.skip(f'{e} (set TIMM_EXT_TIMM_TRAIN to the scripts of the installed timm)')


def pytest_configure(config):
    """Under pytest-xdist (``-n N``, as .ci/run and README's test command run the suite) each worker gets its share
    of the cores as torch threads: N workers with torch's default of one thread per core would wait on each other
    at every operator, several times slower (docs/cli.md#cpu-threads)."""
    register_timm_free(config)
    workers = int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '0'))
    if workers > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


def pytest_collection_finish(session):
    """With ``$TIMM_EXT_COLLECTED_MARKS`` set, every collected test and its marks as JSON lines in that file: what
    test_ci_lanes.py checks the lanes of .ci/run against."""
    path = os.environ.get('TIMM_EXT_COLLECTED_MARKS')
    if path:
        with open(path, 'w') as f:
            f.writelines(json.dumps(dict(test=item.nodeid, marks=sorted({m.name for m in item.iter_markers()}))) + '\n'
                         for item in session.items)
