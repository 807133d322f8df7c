"""reproduction/run_times.py: wall-clock said as wall-clock, CPU time and CPU model only as recorded."""

import pytest
from _reproduction import run_times

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def test_cpu_of_names_recorded_cpus_and_says_where_none_was_recorded():
    xeon = dict(cpu='Intel(R) Xeon(R) Processor')
    assert run_times.cpu_of([xeon, xeon]) == 'on Intel(R) Xeon(R) Processor'
    assert run_times.cpu_of([dict(), dict()]) == 'no CPU model recorded (the reports of the time name AMD EPYC)'
    assert run_times.cpu_of([xeon, dict()]) == ('on Intel(R) Xeon(R) Processor; 1 of them: no CPU model recorded (the '
                                               'reports of the time name AMD EPYC)')


def test_spend_gives_wall_clock_and_cpu_time_only_where_every_run_recorded_it():
    old = [dict(run=f'a-s{i}', timing=dict(start=0.0 + 60 * i, end=60.0 + 60 * i, wall_s=60.0)) for i in range(2)]
    text = run_times.spend(old)
    assert text.startswith('2 runs took 2 min of wall-clock time summed over the runs')
    assert 'at most 1 at a time' in text and text.endswith('; no CPU time recorded (runs before issue 57 kept '
                                                           'wall-clock only)')
    new = [dict(run=f'b-s{i}', timing=dict(start=0.0, end=60.0, wall_s=60.0, cpu_s=30.0)) for i in range(2)]
    assert run_times.spend(new).endswith('; CPU time 1 min (user + system)') and 'at most 2 at a time' in \
        run_times.spend(new)
    assert 'CPU time recorded by 2 of them, 1 min' in run_times.spend(old + new)
    assert run_times.spend([dict(run='c-s0')]) is None
