"""Revision 2.4's rule: a seed whose lr-sweep pair misses the convergence rule trains again at twice the schedule.

For each pair of ``plan.EXTENDED_PAIRS`` and each seed, the schedules are tried in order (``VIT_EPOCHS``,
then 2x, 4x ... up to ``MAX_DOUBLINGS`` doublings), both arms of the pair at each; the seed's runs are those of the
first schedule where both meet the rule, or of the longest one tried. Every run keeps its own folder
(``<arm>-s<seed>``, ``<arm>_x2-s<seed>``, ...), so nothing trained is replaced.
"""
import json
from dataclasses import replace
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from plan import ARM_BY_NAME, EXTENDED_PAIRS, MAX_DOUBLINGS, MEASURE_FILE, Arm


def doubled(arm: Arm, times: int) -> Arm:
    """``arm`` with ``2 ** times`` its schedule, under a name of its own (``times`` 0: the arm itself)."""
    if times == 0:
        return arm
    factor = 2 ** times
    return replace(arm, name=f'{arm.name}_x{factor}', label=f'{arm.label}, {arm.schedule * factor} epochs',
                   schedule=arm.schedule * factor)


EXTENSION_ARMS: Tuple[Arm, ...] = tuple(doubled(ARM_BY_NAME[name], k) for pair in EXTENDED_PAIRS for name in pair
                                        for k in range(1, MAX_DOUBLINGS + 1))


def pair_of(name: str) -> Optional[Tuple[str, str]]:
    return next((pair for pair in EXTENDED_PAIRS if name in pair), None)


def run_dir(runs: Path, name: str, seed: int) -> Path:
    """A run's folder in the cache (train.py's ``--experiment``)."""
    return runs / f'{name}-s{seed}'


def _converged(path: Path) -> Optional[bool]:
    """The run's verdict under the rule, from its measurements; None while it is not measured."""
    m = path / MEASURE_FILE
    return bool(json.loads(m.read_text())['converged']) if m.is_file() else None


def tried(runs: Path, name: str, seed: int) -> List[Path]:
    """The runs of ``name`` (an arm of an extended pair) for ``seed``, shortest schedule first, up to the seed's
    final one: the first schedule where both arms of the pair converged, else the last one measured."""
    pair = pair_of(name)
    if pair is None:
        return [run_dir(runs, name, seed)]
    out: List[Path] = []
    for k in range(MAX_DOUBLINGS + 1):
        dirs = {n: run_dir(runs, doubled(ARM_BY_NAME[n], k).name, seed) for n in pair}
        verdicts = [_converged(d) for d in dirs.values()]
        if None in verdicts:
            break
        out.append(dirs[name])
        if all(verdicts):
            break
    return out or [run_dir(runs, name, seed)]


def pending(runs: Path, names: Sequence[str], seeds: Sequence[int]) -> List[Tuple[Arm, int]]:
    """The runs the rule asks for next: for each seed whose pair was measured at its longest schedule so far and
    missed the rule there, both arms at twice that schedule (none past ``MAX_DOUBLINGS``)."""
    out: List[Tuple[Arm, int]] = []
    for pair in EXTENDED_PAIRS:
        if not all(n in names for n in pair):
            continue
        for seed in seeds:
            done = tried(runs, pair[0], seed)
            k = len(done) - 1
            verdicts = [_converged(run_dir(runs, doubled(ARM_BY_NAME[n], k).name, seed)) for n in pair]
            if None in verdicts or all(verdicts) or k >= MAX_DOUBLINGS:
                continue
            out += [(doubled(ARM_BY_NAME[n], k + 1), seed) for n in pair]
    return out

