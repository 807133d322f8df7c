"""What the report may say about convergence: counts by the rule, every run that misses it named, and the doubling test.

"Converged" in the report means one thing: the run meets ``plan``'s rule (its last 20 % of epochs gain at most
0.6 points). A sentence or heading calls runs converged only through these helpers, which name every run that
misses the rule where it is read, so no label claims more than the runs show (issue 57). The vit-sam paper's own
test, a schedule twice as long gains nothing (its App. H), is stricter than the rule and is reported beside it.
"""
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from measure_run import tail_gain
from plan import CONVERGED_GAIN, CONVERGED_TAIL

from timm_ext.analysis.stats import format_difference, paired_difference

__all__ = ['DOUBLED', 'TOP1_MARGIN', 'converged_cell', 'doubling_text', 'judged', 'missed', 'rule_count']

TOP1_MARGIN = 1.0  # points: the top-1 claims' margin, also what "no gain" from a longer schedule means here
# the vit-sam paper's test of convergence (App. H: a 2x schedule brings no gain): (label, shorter run, the arm)
DOUBLED = (('ViT', 'vit_e30', 'vit'), ('ViT + CB', 'vit_cb_e30', 'vit_cb'),
           ('ViT conv stem', 'vit_convstem_e30', 'vit_convstem'))
Runs = Sequence[Dict[str, Any]]


def judged(ms: Runs) -> List[Dict[str, Any]]:
    """The runs the rule can judge: an end-of-warmup checkpoint (1 epoch) has no last 20 % to compare."""
    return [m for m in ms if math.isfinite(tail_gain(m['top1_curve']))]


def missed(ms: Runs, name: Optional[str] = None) -> List[str]:
    """Every run of ``ms`` that misses the rule, named with its gain in its last epochs: '<arm> seed S (+G)'."""
    return [f'{name or m.get("arm")} seed {m["seed"]} (+{tail_gain(m["top1_curve"]):.1f})'
            for m in judged(ms) if not m['converged']]


def converged_cell(ms: Runs) -> str:
    """A table's "converged" cell: how many runs meet the rule, and the seeds that miss it with their gain."""
    runs = judged(ms)
    if not runs:
        return 'end of warmup (rule n/a)'
    miss = [f'seed {m["seed"]} +{tail_gain(m["top1_curve"]):.1f}' for m in runs if not m['converged']]
    return f'{len(runs) - len(miss)}/{len(runs)}' + (f' ({", ".join(miss)})' if miss else '')


def rule_count(ms: Runs, name: Optional[str] = None) -> str:
    """'N of M meet the rule' for ``ms``, naming the runs that miss it."""
    runs = judged(ms)
    miss = missed(runs, name)
    return f'{len(runs) - len(miss)} of {len(runs)}' + (f' (missing it: {", ".join(miss)})' if miss else '')


def rule_text() -> str:
    return (f'the best validation top-1 of the last {CONVERGED_TAIL:.0%} of the epochs beats the best before them by '
            f'at most {CONVERGED_GAIN} points (2 images)')


def doubling_text(pairs: Sequence[Tuple[str, Runs, Runs]]) -> str:
    """The vit-sam paper's test of convergence per (label, shorter runs, runs at twice the schedule), same seeds: where
    the gain's interval lies above 0 the shorter schedule had not converged by that test, whatever the rule says;
    where it lies below the margin the longer one gained less than a point. Shorter runs that miss the rule are
    named, so no schedule is called enough over a run that was still improving."""
    parts, still, small = [], [], []
    for label, short, full in pairs:
        by_seed = {m['seed']: m for m in short}
        both = [(by_seed[m['seed']], m) for m in full if m['seed'] in by_seed]
        if len(both) < 2:
            continue
        d = paired_difference([a['top1'] for a, _ in both], [b['top1'] for _, b in both])
        epochs = (len(both[0][0]['top1_curve']), len(both[0][1]['top1_curve']))
        parts.append(f'{label} {epochs[0]} -> {epochs[1]} epochs {format_difference(d, ".2f", " pt")} ({d.n} seeds)')
        meet = sum(bool(a['converged']) for a, _ in both)
        where = f'{label} at {epochs[0]} epochs ({meet} of {d.n} runs meet the rule there)'
        if d.low > 0:
            still.append(where)
        elif d.high < TOP1_MARGIN:
            miss = missed([a for a, _ in both])
            small.append(f'{label} from {epochs[0]} epochs' + (f' (though {", ".join(miss)} misses the rule)'
                                                                 if miss else ''))
    if not parts:
        return ''
    text = ('The vit-sam paper\'s own test of convergence is that a schedule twice as long brings no gain (its App. '
            'H); top-1 gained by doubling, same seed: ' + '; '.join(parts) + '.')
    if still:
        text += (f' By that test these had not converged, the rule notwithstanding: {"; ".join(still)}: "converged" '
                 'in this report means "meets the rule", not "gains nothing from longer training".')
    if small:
        text += f' Doubling gained less than {TOP1_MARGIN:g} point (the whole interval) for {"; ".join(small)}.'
    return text
