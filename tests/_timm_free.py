"""Two marks for tests whose result cannot depend on the timm release beyond what every release lane proves anyway.

- ``timm_free``: the test calls no timm code at all.
- ``timm_models_only``: the test calls timm only in its models and layers (``timm.models``, ``timm.layers``: building,
  running, listing models), never a release-bound part: timm's optimizers, data, task, utils, loss or scheduler
  packages, its hub and checkpoint loading, timm-ext's compat and backport modules or its reading of timm's
  scripts, nor a child process (train.py, validate.py, the CLI). What those model calls touch, the model contract
  (tests/test_models.py, every registered model: create, forward, backward, features, intermediates,
  reset_classifier, pretrained cfg) runs in every release lane.

The release lanes of .ci/run (timm 1.0.23 and 1.0.28) deselect both (``-m "not slow and not timm_free and not
timm_models_only"``); the newest lane runs them (docs/compatibility.md#what-each-lane-leaves-out). The marks cannot go
stale: wherever a marked test runs, a profiler watches its setup and its call, and the test fails when they make a
call its mark rules out (outside an import: a module that registers timm models on import does so once per process,
in whichever test imports it first). ``TIMM_EXT_TIMM_CALLS=<file>`` watches every test instead and writes, per test,
its first timm call and its first release-bound call (or none) as JSON lines: how the marked tests were found.
"""
import json
import os
import subprocess
import sys
import threading
from multiprocessing import popen_fork, popen_forkserver, popen_spawn_posix
from typing import List, Optional

import pytest
import timm

import timm_ext

MARK = 'timm_free'
MODELS_MARK = 'timm_models_only'
RECORD_ENV = 'TIMM_EXT_TIMM_CALLS'
_TIMM_DIR = os.path.dirname(os.path.abspath(timm.__file__)) + os.sep
_TIMM_EXT_DIR = os.path.dirname(os.path.abspath(timm_ext.__file__)) + os.sep
# where a child process starts, in Python code (sys.settrace sees no C call such as os.system): a forkserver's child
# (torch.multiprocessing's start_method='forkserver') is asked for in popen_forkserver's _launch
_CHILD_CODES = {subprocess.Popen._execute_child.__code__, popen_fork.Popen._launch.__code__,
                popen_forkserver.Popen._launch.__code__, popen_spawn_posix.Popen._launch.__code__}
# the files whose frames the watch looks at: timm's, timm-ext's, and those where a child process starts
_WATCHED = tuple({_TIMM_DIR, _TIMM_EXT_DIR, *(c.co_filename for c in _CHILD_CODES)})
# the parts of timm a timm_models_only test may call: its models and layers, but how it loads weights
_MODEL_DIRS = tuple(_TIMM_DIR + d + os.sep for d in ('models', 'layers'))
_LOADING = tuple(_TIMM_DIR + os.path.join('models', f) for f in ('_hub.py', '_helpers.py'))
_LOADING_CODES = {'load_pretrained', 'load_custom_pretrained'}  # in timm/models/_builder.py
# timm-ext's modules that exist for the differences between timm releases
_BOUND_TIMM_EXT = tuple(_TIMM_EXT_DIR + f for f in (
    '_timm_compat.py', '_timm_backports.py', '_requirements.py', os.path.join('launch', 'timm_scripts.py')))


def _importing(frame) -> bool:
    """Whether ``frame`` runs inside an import (importlib's frames are on its stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith('<frozen importlib'):
            return True
        frame = frame.f_back
    return False


def _release_bound(code) -> bool:
    """Whether a call of ``code`` (in timm's package, or one of timm-ext's release modules) is release-bound."""
    path = code.co_filename
    if path.startswith(_BOUND_TIMM_EXT):
        return True
    if not path.startswith(_TIMM_DIR):
        return False
    if not path.startswith(_MODEL_DIRS):  # timm's optim, data, task, utils, loss, scheduler: all but the package's
        return os.path.dirname(path) + os.sep != _TIMM_DIR  # own __init__.py and version.py
    return path.startswith(_LOADING) or code.co_name in _LOADING_CODES


class TimmCallWatch:
    """Records the first call into timm's package, the first release-bound call, and the first child process while
    it is on (sys.settrace, and threading.settrace for threads started meanwhile)."""

    def __init__(self) -> None:
        self.first: Optional[str] = None  # any timm call, or a child process
        self.first_bound: Optional[str] = None  # a release-bound call, or a child process

    @staticmethod
    def _name(code) -> str:
        if code in _CHILD_CODES:
            return f'a child process ({code.co_qualname})'
        top = _TIMM_DIR if code.co_filename.startswith(_TIMM_DIR) else _TIMM_EXT_DIR
        where = os.path.relpath(code.co_filename, os.path.dirname(top.rstrip(os.sep)))
        owner = "timm's" if top == _TIMM_DIR else "timm-ext's"
        return f"{owner} {code.co_name}() ({where}:{code.co_firstlineno})"

    def _trace(self, frame, event, arg):
        """sys.settrace's global function: called at each new Python frame only (not per C call or line, as it
        returns None); one prefix test lets the frames of torch and the rest go, which keeps the watch to a
        fraction of a marked test's time."""
        if frame.f_code.co_filename.startswith(_WATCHED) and (self.first_bound is None or self.first is None):
            code = frame.f_code
            if code in _CHILD_CODES:
                self.first = self.first or self._name(code)
                self.first_bound = self.first_bound or self._name(code)
            elif code.co_filename.startswith((_TIMM_DIR, _TIMM_EXT_DIR)):
                timm_call = self.first is None and code.co_filename.startswith(_TIMM_DIR)
                bound = self.first_bound is None and _release_bound(code)
                if (timm_call or bound) and not _importing(frame):
                    self.first = self._name(code) if timm_call else self.first
                    self.first_bound = self._name(code) if bound else self.first_bound
        return None

    def __enter__(self) -> 'TimmCallWatch':
        self._before = sys.gettrace()
        # a coverage tracer or a debugger keeps its own: the test then runs unwatched; a watch inside a watch (a test
        # of it while every test is watched) takes over until it ends
        self._on = self._before is None or isinstance(getattr(self._before, '__self__', None), TimmCallWatch)
        if self._on:
            sys.settrace(self._trace)
            threading.settrace(self._trace)
        return self

    def __exit__(self, *exc) -> None:
        if self._on:
            sys.settrace(self._before)
            threading.settrace(self._before)


class TimmFreePlugin:
    """Watches the marked tests (or all of them, recording) and fails a marked one that calls timm."""

    def __init__(self, record_path: Optional[str]) -> None:
        self.record_path = record_path
        self.records: List[dict] = []

    def _watched(self, item) -> bool:
        return self.record_path is not None or any(item.get_closest_marker(m) is not None for m in (MARK, MODELS_MARK))

    def _watch(self, item):
        if not self._watched(item) or getattr(item, '_timm_first_bound', None):
            return None
        return TimmCallWatch()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._phase(item)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._phase(item)

    def _phase(self, item):
        watch = self._watch(item)
        if watch is None:
            yield
            return
        with watch:
            yield
        item._timm_first_call = getattr(item, '_timm_first_call', None) or watch.first
        item._timm_first_bound = watch.first_bound

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.when != 'call':
            return
        first = getattr(item, '_timm_first_call', None)
        bound = getattr(item, '_timm_first_bound', None)
        if self.record_path is not None:
            self.records.append(dict(test=item.nodeid, first=first, bound=bound))
        for mark, call in ((MARK, first), (MODELS_MARK, bound)):
            if call and report.passed and item.get_closest_marker(mark) is not None:
                report.outcome = 'failed'
                report.longrepr = (f'{item.nodeid} is marked {mark} (the release lanes leave it out) but called {call}:'
                                   f' remove the mark, so that every timm release runs it')

    def pytest_sessionfinish(self, session):
        if self.record_path is None or not self.records:
            return
        worker = os.environ.get('PYTEST_XDIST_WORKER', 'main')
        with open(f'{self.record_path}.{worker}', 'w') as f:
            f.writelines(json.dumps(r) + '\n' for r in self.records)


def register(config) -> None:
    """Adds the watch to a pytest run (from conftest.py's pytest_configure; pyproject.toml declares the mark)."""
    config.pluginmanager.register(TimmFreePlugin(os.environ.get(RECORD_ENV)), 'timm_ext_timm_free')
