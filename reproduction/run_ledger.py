"""Every run ever trained for the reproduction report, by revision, and where its result is (issue 57).

measurements.json keeps the runs the current report reads, the runs they replaced, and under ``earlier_runs`` the
runs of a withdrawn arm recovered from this repository's history (``recover_earlier_runs.py``). Runs whose numbers
live only in an earlier commit's measurements.json are named with that commit; runs whose numbers were never written
down, or were discarded part-way, are listed with what was lost and why. ``TRAINED`` is that record; the report prints
it, and a test checks that every run in measurements.json is listed here and nothing listed here as kept is missing.
"""
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Sequence, Set, Tuple

from plan import EXTENDED_GROUP, LONG_REUSED, LONG_SEEDS, R5_ARMS, R5_CHECK, R5_PILOT_SEEDS, SEEDS

__all__ = ['EARLIER', 'HERE', 'TRAINED', 'Batch', 'archived_runs', 'earlier_reading', 'kept_here', 'ledger_section',
           'load_earlier_runs']

HERE = 'runs'  # in this measurements.json, read by the report
EARLIER = 'earlier_runs'  # in this measurements.json, recovered from the history, read by no claim


@dataclass(frozen=True)
class Batch:
    """Runs one revision trained together: how many, which (``arms``: (arm, seeds) where they are kept in this
    measurements.json) and where their numbers are."""
    revision: str
    what: str
    count: int
    where: str  # HERE, EARLIER, a git object holding them, or 'lost'
    arms: Tuple[Tuple[str, Tuple[int, ...]], ...] = ()
    note: str = ''


def _seeds(first: int, last: int, skip: Sequence[int] = ()) -> Tuple[int, ...]:
    return tuple(s for s in range(first, last + 1) if s not in skip)


_FIVE = tuple(SEEDS)
_V3_ARMS = ('vit', 'vit_sam', 'resnet', 'resnet_sam', 'alternet', 'vit_cb', 'vit_convstem', 'vit_half', 'vit_sam_half',
            'vit_quarter', 'vit_sam_quarter', 'vit_lr1.5e-3', 'vit_convstem_lr1.5e-3', 'vit_e30', 'vit_cb_e30',
            'vit_convstem_e30', 'vit_cb_all', 'vit_warmup', 'resnet_warmup', 'alternet_warmup', 'vit_quarter_warmup')
_LONG_NEW = tuple(s for s in LONG_SEEDS if s not in LONG_REUSED)

TRAINED: Tuple[Batch, ...] = (
    Batch('v1', '6 arms x seeds 0-2, 6 epochs, 32 px', 18, '7a1a3d5:docs/reproduction/measurements.json'),
    Batch('2', '80 claim runs (16 arms x 5 seeds, 30 epochs; subsets 60 / 120) and 50 supporting runs (6- and '
          '15-epoch schedules, end-of-warmup checkpoints)', 130, '41252ab:docs/reproduction/measurements.json',
          note='revision 2.1 read 55 of them again: the 30-epoch ViTs under other names, measured again; CB in '
               'every block; the CNNs; the end-of-warmup checkpoints'),
    Batch('2.1', 'the 8 ViT arms at 60 epochs (subsets 120 / 240), seeds 0-4', 40,
          '6b6c309:docs/reproduction/measurements.json',
          note='revision 2.3 trained them again from a clean cache: the same top-1 curves in all 40'),
    Batch('2.1', 'the lr 3e-3 pair (patchify, conv stem) at 60 epochs, seeds 0-4', 10, 'lost',
          note='only counts were written (patchify 0 of 5 met the rule, still gaining 1.4 to 4.7 points in its last '
               '12 epochs; conv stem 3 of 5: plan.py, revision 2.2); the runs lived in that session\'s cache, on a '
               'machine that is gone, and the next report printed the lr 2e-3 pair in their place'),
    Batch('2.2', 'pilot: seed 0 of the lr 2e-3 pair, 60 epochs, outside the study\'s cache', 2, 'lost',
          note='only "both stems met the rule" was written (plan.py, revision 2.2); ViT runs repeat bit for bit on '
               'that machine, so they are likely the lr 2e-3 seed-0 runs below, which was not checked'),
    Batch('2.2', 'pilot: seed 0 of the lr 3e-3 pair with 5 warmup epochs, 60 epochs', 2, 'lost',
          note='only their session\'s closing note has them: neither met the rule (last 20 % gained +2.5 / +3.1 '
               'points; top-1 81.9 / 89.4 %, patchify / conv stem)'),
    Batch('2.2', 'the lr 2e-3 pair at 60 epochs, seeds 0-4', 10, EARLIER,
          (('vit_lr2e-3', _FIVE), ('vit_convstem_lr2e-3', _FIVE)),
          'recovered from 6b6c309:docs/reproduction/measurements.json; withdrawn by revision 2.3'),
    Batch('2.3', 'v3 from a clean cache: 21 arms x seeds 0-4, each at its first schedule', 105, HERE,
          tuple((arm, _FIVE) for arm in _V3_ARMS)),
    Batch('2.4', 'the lr 1.5e-3 pair again at 120 epochs, seeds 2 and 3', 4, HERE,
          (('vit_lr1.5e-3_x2', (2, 3)), ('vit_convstem_lr1.5e-3_x2', (2, 3)))),
    Batch('3', 'the new seeds of the four claims within reach', 44, HERE,
          (('vit', _seeds(5, 15)), ('vit_sam', _seeds(5, 15)), ('resnet', _seeds(5, 13)), ('resnet_sam', _seeds(5, 13)),
           ('vit_convstem', _seeds(5, 8)))),
    Batch('3', 'check: vit seed 0 trained again outside the study', 1, 'vit seed 0 of this measurements.json',
          note='equal to the archived run bit for bit (every epoch\'s top-1 and loss, lambda_max, L^N, NEP, APE, '
               'active share), by its session\'s note; not kept on its own'),
    Batch('3.1', f'{", ".join(EXTENDED_GROUP[:2])} at seeds 6, 12, 14 and vit_convstem at seed 6, 120 epochs', 7, HERE,
          (('vit_x2', (6, 12, 14)), ('vit_sam_x2', (6, 12, 14)), ('vit_convstem_x2', (6,)))),
    Batch('4', 'vit and vit_sam at 120 epochs, the 13 seeds revision 3.1 had not trained', 26, HERE,
          (('vit_x2', _LONG_NEW), ('vit_sam_x2', _LONG_NEW))),
    Batch('4', 'vit_sam_x2 seed 11 and vit_x2 seed 13, stopped part-way', 2, 'lost',
          note='the session ended at about 06:57 UTC with them in flight (begun about 06:51:40 and 06:53:35, when '
               'their lanes freed); the study resumed at 07:41:19, after that stop\'s landing CI (2,525 s), deleted '
               'their folders (train.py cannot resume a partial run) and trained both from the start; never measured '
               'or read: the 48 minutes between 06:53 and 07:41 with no run finishing'),
    Batch('5', 'first training: its check and its pilot (12 arms x seeds 0-2), 120 epochs', 37, 'lost',
          note='trained 2026-12-02 13:57 to 19:57 UTC, 410 CPU-min; the machine that held the cache was gone before '
               'a report had put them in measurements.json. What was written of them is that session\'s closing '
               'note (stop 67: pooled sd 1.01 pt, every claim out of reach; LookSAM, bSAM seeds 1 and 2 and '
               'Momentum-SAM seed 1 dropped). The second training repeats every number that note wrote'),
    Batch('5', 'first training: vit_samon_x2 and vit_wsam_x2 seed 1, stopped part-way (epochs 109 and 103)', 2,
          'lost', note='their session ended with them in flight; recorded as stopped and trained again from the start '
                       'in the first training; the record was lost with the cache'),
    Batch('5', 'its check and its pilot trained again from 2026-12-03 01:47 UTC: the same plan (db05449), the same '
          '37 jobs', 37, HERE, ((R5_CHECK[0].name, (R5_CHECK[1],)), *((a.name, R5_PILOT_SEEDS) for a in R5_ARMS))),
    Batch('5', 'vit_bsam_x2 seed 1 and vit_esam_x2 seed 2, stopped part-way (epochs 12 and 4)', 2, 'lost',
          note='the study was stopped at 04:29 UTC for its session\'s end with them in flight; recorded in this '
               'file\'s `stopped_runs` (epochs, when last written, why) and trained again from the start; nothing '
               'of theirs was read'),
    Batch('5', 'LookSAM diagnosis: the arm\'s first 6 epochs in a plain loop, at alpha 0, 0.1, 0.3 and 0.7, seed 0 '
          '(looksam_reuse.py, not train.py)', 4, 'looksam_reuse.json beside this measurements.json',
          note='2.5 CPU-min; read by the report\'s paragraph on why the LookSAM arm stays at chance, by no claim'),
)


def kept_here() -> Dict[str, Set[str]]:
    """The runs ``TRAINED`` says this measurements.json keeps, as run folders (``<arm>-s<seed>``), by section."""
    out: Dict[str, Set[str]] = {HERE: set(), EARLIER: set()}
    for batch in TRAINED:
        if batch.where in out:
            out[batch.where] |= {f'{arm}-s{seed}' for arm, seeds in batch.arms for seed in seeds}
    return out


def _records(saved: Dict[str, Any], section: str) -> Iterator[Dict[str, Any]]:
    for ms in saved.get(section, {}).values():
        for m in ms:
            yield from (*m.get('replaced', []), m)


def archived_runs(saved: Dict[str, Any]) -> Dict[str, Set[str]]:
    """The run folders a measurements.json holds, by section (a run read under two arms counted once)."""
    return {section: {m.get('run') or f'{m["arm"]}-s{m["seed"]}' for m in _records(saved, section)}
            for section in (HERE, EARLIER)}


def load_earlier_runs(path: Path) -> Dict[str, List[Dict[str, Any]]]:
    """The ``earlier_runs`` of a report's measurements.json ({} where it has none or cannot be read: a study's first
    report)."""
    try:
        return dict(json.loads(Path(path).read_text()).get(EARLIER, {}))
    except (OSError, ValueError, AttributeError):
        return {}


def earlier_reading(earlier: Dict[str, List[Dict[str, Any]]]) -> str:
    """The withdrawn lr 2e-3 claim read again from the recovered runs, as the report of 6b6c309 read it."""
    from claims import read
    from plan import Claim

    a, b = 'vit_lr2e-3', 'vit_convstem_lr2e-3'
    if a not in earlier or b not in earlier:
        return ''
    claim = Claim('stem_lr_2e-3', 'scaled-relu', 'Table 1', 'at lr 2e-3 the conv stem reaches a higher top-1 than '
                  'patchify', 'top1', a, b, 'increase', 1.0, ' pt')
    (c,) = read({a: earlier[a], b: earlier[b]}, [claim])
    from measure_run import tail_gain

    from timm_ext.analysis.stats import format_difference

    missed = [f'{m["run"]} (+{tail_gain(m["top1_curve"]):.1f})' for arm in (a, b) for m in earlier[arm]
              if not m['converged']]
    return (f'Read again from the recovered runs, revision 2.2\'s claim (withdrawn by revision 2.3): '
            f'{format_difference(c.diff, ".2f", " pt")}, {c.agree}/{c.n} agree, {c.verdict_text()}; runs that miss '
            f'the convergence rule: {", ".join(missed) or "none"}.')


def ledger_section(earlier: Dict[str, List[Dict[str, Any]]]) -> List[str]:
    """The report's list of every run ever trained for it."""
    total = sum(b.count for b in TRAINED)
    lines = ['## Every run trained for this report', '',
             f'{total} runs, by revision, and where each one\'s numbers are ("this file": `runs` or `earlier_runs` of '
             '`measurements.json`; a commit: that commit\'s measurements.json, `git show COMMIT:PATH`; "lost": what '
             'was written of them, and why nothing more was).', '',
             '| revision | runs | what | where their numbers are | note |', '|---|---|---|---|---|']
    for b in TRAINED:
        where = {HERE: 'this file, `runs`', EARLIER: 'this file, `earlier_runs`'}.get(b.where, b.where)
        lines.append(f'| {b.revision} | {b.count} | {b.what} | {where} | {b.note} |')
    reading = earlier_reading(earlier)
    return lines + ([''] + [reading] if reading else []) + ['']
