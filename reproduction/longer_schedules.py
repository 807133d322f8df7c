"""Revisions 2.4 and 3.1: a seed whose group of arms misses the convergence rule trains again at twice the schedule;
revision 4: the ViT pair at twice its schedule for every seed (``LONG_ARMS``), whatever the rule says.

A seed's group is the lr sweep's pair (``plan.EXTENDED_PAIRS``, revision 2.4) or, at revision 3's new seeds, the
ViT arms of ``plan.EXTENDED_GROUP`` that are trained for that seed (revision 3.1). The schedules are tried in order
(the arm's own, then 2x, 4x ... up to ``MAX_DOUBLINGS`` doublings), every arm of the group at each; the seed's runs
are those of the first schedule where all of them meet the rule, or of the longest one tried. Every run keeps its
own folder (``<arm>-s<seed>``, ``<arm>_x2-s<seed>``, ...), so nothing trained is replaced.
"""
import json
from dataclasses import replace
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from plan import (
    ARM_BY_NAME,
    EXTENDED_GROUP,
    EXTENDED_PAIRS,
    LONG_FACTOR,
    LONG_PAIR,
    MAX_DOUBLINGS,
    MEASURE_FILE,
    Arm,
    extended_seeds,
)


def doubled(arm: Arm, times: int) -> Arm:
    """``arm`` with ``2 ** times`` its schedule, under a name of its own (``times`` 0: the arm itself)."""
    if times == 0:
        return arm
    factor = 2 ** times
    return replace(arm, name=f'{arm.name}_x{factor}', label=f'{arm.label}, {arm.schedule * factor} epochs',
                   schedule=arm.schedule * factor)


# revision 4: the ViT pair at LONG_FACTOR times its schedule for every seed (the same names as revision 3.1's runs)
LONG_ARMS: Tuple[Arm, ...] = tuple(doubled(ARM_BY_NAME[name], LONG_FACTOR.bit_length() - 1) for name in LONG_PAIR)

EXTENSION_ARMS: Tuple[Arm, ...] = tuple(doubled(ARM_BY_NAME[name], k) for group in (*EXTENDED_PAIRS, EXTENDED_GROUP)
                                        for name in group for k in range(1, MAX_DOUBLINGS + 1))


def group_of(name: str, seed: int) -> Optional[Tuple[str, ...]]:
    """The arms that train ``seed`` again with ``name`` (``name`` among them), or None where no rule extends it."""
    pair = next((pair for pair in EXTENDED_PAIRS if name in pair), None)
    if pair is not None:
        return pair
    if name in EXTENDED_GROUP and seed in extended_seeds(name):
        return tuple(n for n in EXTENDED_GROUP if seed in extended_seeds(n))
    return None


def run_dir(runs: Path, name: str, seed: int) -> Path:
    """A run's folder in the cache (train.py's ``--experiment``)."""
    return runs / f'{name}-s{seed}'


def _converged(path: Path) -> Optional[bool]:
    """The run's verdict under the rule, from its measurements; None while it is not measured."""
    m = path / MEASURE_FILE
    return bool(json.loads(m.read_text())['converged']) if m.is_file() else None


def tried(runs: Path, name: str, seed: int) -> List[Path]:
    """The runs of ``name`` for ``seed``, shortest schedule first, up to the seed's final one: the first schedule where
    every arm of its group converged, else the last one measured (the run itself where no rule extends it)."""
    group = group_of(name, seed)
    if group is None:
        return [run_dir(runs, name, seed)]
    out: List[Path] = []
    for k in range(MAX_DOUBLINGS + 1):
        dirs = {n: run_dir(runs, doubled(ARM_BY_NAME[n], k).name, seed) for n in group}
        verdicts = [_converged(d) for d in dirs.values()]
        if None in verdicts:
            break
        out.append(dirs[name])
        if all(verdicts):
            break
    return out or [run_dir(runs, name, seed)]


def pending(runs: Path, names: Sequence[str], seeds: Sequence[int],
            leads: Optional[Sequence[str]] = None) -> List[Tuple[Arm, int]]:
    """The runs the rules ask for next, among ``seeds``: for each seed whose group was measured at its longest schedule
    so far and missed the rule there, every arm of the group at twice that schedule (none past ``MAX_DOUBLINGS``).
    A group is only extended where all of its arms are among ``names``; ``leads`` names each group by its first arm
    (default: every group of revisions 2.4 and 3.1)."""
    out: List[Tuple[Arm, int]] = []
    for seed in seeds:
        for lead in leads if leads is not None else (*(pair[0] for pair in EXTENDED_PAIRS), EXTENDED_GROUP[0]):
            group = group_of(lead, seed)
            if group is None or not all(n in names for n in group):
                continue
            k = len(tried(runs, lead, seed)) - 1
            verdicts = [_converged(run_dir(runs, doubled(ARM_BY_NAME[n], k).name, seed)) for n in group]
            if None in verdicts or all(verdicts) or k >= MAX_DOUBLINGS:
                continue
            out += [(doubled(ARM_BY_NAME[n], k + 1), seed) for n in group]
    return out

