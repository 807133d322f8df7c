"""The ``timm_free`` mark: a test whose run calls no timm code, so its result cannot depend on the timm release.

The release lanes of .ci/run (timm 1.0.23 and 1.0.28) deselect these tests (``-m "not slow and not timm_free"``);
the newest lane runs them (docs/compatibility.md#what-each-lane-leaves-out). The mark cannot go stale: wherever a
marked test runs, a profiler watches its setup and its call, and the test fails when they call a function defined
in timm's package (outside an import: a module that registers timm models on import does so once per process, in
whichever test imports it first) or start a child process (which may run timm, e.g. train.py).
``TIMM_EXT_TIMM_CALLS=<file>`` watches every test instead and writes, per test, its first timm call or child
process (or none) as JSON lines: how the marked tests were found.
"""
import json
import os
import subprocess
import sys
import threading
from multiprocessing import popen_fork, popen_spawn_posix
from typing import List, Optional

import pytest
import timm

MARK = 'timm_free'
RECORD_ENV = 'TIMM_EXT_TIMM_CALLS'
_TIMM_DIR = os.path.dirname(os.path.abspath(timm.__file__)) + os.sep
# where a child process starts, in Python code (sys.settrace sees no C call such as os.system)
_CHILD_CODES = {subprocess.Popen._execute_child.__code__, popen_fork.Popen._launch.__code__,
                popen_spawn_posix.Popen._launch.__code__}


def _importing(frame) -> bool:
    """Whether ``frame`` runs inside an import (importlib's frames are on its stack)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith('<frozen importlib'):
            return True
        frame = frame.f_back
    return False


class TimmCallWatch:
    """Records the first call into timm's package, or the first child process, while it is on (sys.settrace, and
    threading.settrace for threads started meanwhile)."""

    def __init__(self) -> None:
        self.first: Optional[str] = None

    def _trace(self, frame, event, arg):
        """sys.settrace's global function: called at each new Python frame only (not per C call or line, as it
        returns None), which keeps the watch to a fraction of a marked test's time."""
        if self.first is None:
            code = frame.f_code
            if code.co_filename.startswith(_TIMM_DIR) and not _importing(frame):
                where = os.path.relpath(code.co_filename, os.path.dirname(_TIMM_DIR.rstrip(os.sep)))
                self.first = f"timm's {code.co_name}() ({where}:{code.co_firstlineno})"
            elif code in _CHILD_CODES:
                self.first = f'a child process ({code.co_qualname})'
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
        return self.record_path is not None or item.get_closest_marker(MARK) is not None

    def _watch(self, item):
        if not self._watched(item) or getattr(item, '_timm_first_call', None):
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
        if watch.first:
            item._timm_first_call = watch.first

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.when != 'call':
            return
        first = getattr(item, '_timm_first_call', None)
        if self.record_path is not None:
            self.records.append(dict(test=item.nodeid, first=first))
        if first and report.passed and item.get_closest_marker(MARK) is not None:
            report.outcome = 'failed'
            report.longrepr = (f'{item.nodeid} is marked {MARK} (the release lanes leave it out) but called {first}: '
                               f'remove the mark, so that every timm release runs it')

    def pytest_sessionfinish(self, session):
        if self.record_path is None or not self.records:
            return
        worker = os.environ.get('PYTEST_XDIST_WORKER', 'main')
        with open(f'{self.record_path}.{worker}', 'w') as f:
            f.writelines(json.dumps(r) + '\n' for r in self.records)


def register(config) -> None:
    """Adds the watch to a pytest run (from conftest.py's pytest_configure; pyproject.toml declares the mark)."""
    config.pluginmanager.register(TimmFreePlugin(os.environ.get(RECORD_ENV)), 'timm_ext_timm_free')
