"""How the report states where the runs' time went: wall-clock as wall-clock, CPU time and CPU model only as recorded.

Until issue 57 the study recorded each run's wall-clock span (file times plus the measurement's own clock) and, from
revision 4, the CPU model; the report called the span "min one core each". These helpers say "wall-clock", give CPU
time only from runs that recorded it (``timm_ext_cpu.json``), and say where a run recorded no CPU model or CPU time.
"""
import time
from typing import Any, Dict, Optional, Sequence

from run_results import timing_of

__all__ = ['cpu_of', 'spend', 'when']

# what the reports that published the runs before revision 4 named as their machine; no run of theirs recorded it
EARLIER_CPU = 'AMD EPYC'


def when(t: float, day: bool = True) -> str:
    """A file time as the report prints it: UTC, to the minute (the date left out with ``day=False``)."""
    return time.strftime('%Y-%m-%d %H:%M' if day else '%H:%M', time.gmtime(t))


def cpu_of(runs: Sequence[Dict[str, Any]]) -> str:
    """'on <CPU>' for the CPUs that trained ``runs`` as recorded per run (``measure_run.py`` writes it since revision
    4), and for runs without one that they recorded none, with the machine their reports named."""
    names = sorted({m['cpu'] for m in runs if m.get('cpu')})
    bare = sum(not m.get('cpu') for m in runs)
    none = f'no CPU model recorded (the reports of the time name {EARLIER_CPU})'
    if not bare:
        return 'on ' + ' and '.join(names)
    return (f'on {" and ".join(names)}; {bare} of them: {none}' if names else none)


def spend(runs: Sequence[Dict[str, Any]], day: bool = True) -> Optional[str]:
    """'N runs took W min of wall-clock time summed over the runs (training and measuring), A at a time, between X and
    Y UTC', then their CPU time where every one recorded it, or how many did not; None where none is timed."""
    t = timing_of(runs)
    if t is None:
        return None
    cpu = (f'; CPU time {t["cpu_min"]:.0f} min (user + system)' if t['cpu_runs'] == t['runs'] else
           f'; CPU time recorded by {t["cpu_runs"]} of them, {t["cpu_min"]:.0f} min' if t['cpu_runs'] else
           '; no CPU time recorded (runs before issue 57 kept wall-clock only)')
    return (f'{t["runs"]} runs took {t["wall_min"]:.0f} min of wall-clock time summed over the runs (training and '
            f'measuring; each measuring process\'s start-up not counted), at most {t["at_once"]} at a time, between '
            f'{when(t["first"])} and {when(t["last"], day)} UTC{cpu}')
