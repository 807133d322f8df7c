"""The report's section on a family of arms against a reference pair, per unit of compute (revision 5's kind).

Each arm is read against the AdamW and SAM runs it is paired with by seed: its gain over AdamW with its interval, the
share of SAM's gain it keeps at the same seeds, its claim against SAM (read at the seeds the revision's rule gave it,
or marked out of reach with the seeds it would need, or dropped with why), its step time over AdamW's measured side by
side (``step_cost.py``), its runs' CPU time and convergence; a plot of gain against cost with the Pareto front marked,
and every run that failed or was stopped, named with why.
"""
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from claims import ClaimResult
from convergence_text import converged_cell
from plan import CLAIM_BY_KEY, R5_BUDGET_CPU_MIN, R5_CHECK, RevisionPlan
from power import SeedDecision, pooled_sd
from report_tables import mean_sd
from run_results import Results
from run_times import cpu_of, spend

from timm_ext.analysis.stats import PairedDifference, format_difference, paired_difference

__all__ = ['TITLE', 'cost_gain_section', 'draw_cost_gain', 'gain', 'load_revision', 'pareto', 'points', 'share']

TITLE = 'What each SAM buys per unit of compute (revision 5)'
PT = ('.2f', ' pt')


def _top1(ms: Sequence[Dict[str, Any]]) -> Dict[int, float]:
    return {m['seed']: m['top1'] for m in ms}


def gain(arm: Sequence[Dict[str, Any]], adamw: Sequence[Dict[str, Any]]) -> Optional[PairedDifference]:
    """The arm's top-1 minus AdamW's, paired by seed, at the arm's seeds (None below 2 seeds)."""
    a, b = _top1(adamw), _top1(arm)
    seeds = [s for s in b if s in a]
    return paired_difference([a[s] for s in seeds], [b[s] for s in seeds]) if len(seeds) > 1 else None


def share(arm: Sequence[Dict[str, Any]], adamw: Sequence[Dict[str, Any]], sam: Sequence[Dict[str, Any]]) -> float:
    """The share of SAM's mean gain over AdamW the arm keeps, at the arm's seeds."""
    a, b, s = _top1(adamw), _top1(arm), _top1(sam)
    seeds = [x for x in b if x in a and x in s]
    sam_gain = statistics.fmean(s[x] - a[x] for x in seeds)
    return statistics.fmean(b[x] - a[x] for x in seeds) / sam_gain if sam_gain else float('nan')


def points(labels: Dict[str, str], cost: Dict[str, float], gains: Dict[str, PairedDifference],
           read: Sequence[str]) -> List[Tuple[str, float, float, float, float, bool]]:
    """The plot's points: (label, cost ratio, mean gain, low, high, whether its claim was read), one per arm."""
    return [(labels[n], cost[n], g.mean, g.low, g.high, n in read) for n, g in gains.items() if n in cost]


def pareto(pts: Sequence[Tuple[str, float, float, float, float, bool]]) -> List[str]:
    """The labels no other point beats on both axes (a lower or equal cost and a higher or equal mean gain, one of
    them strictly): the front of what a step's compute buys."""
    return [p[0] for p in pts if not any(q[1] <= p[1] and q[2] >= p[2] and (q[1] < p[1] or q[2] > p[2])
                                         for q in pts)]


def draw_cost_gain(pts: Sequence[Tuple[str, float, float, float, float, bool]], figs: Path) -> List[str]:
    """cost_gain.png: gain over AdamW (mean and 95 % interval) against step time over AdamW's, every arm a point, the
    Pareto front joined; an arm whose claim was not read (out of reach or dropped) is drawn hollow."""
    if not pts:
        return []
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    figs.mkdir(parents=True, exist_ok=True)
    front = set(pareto(pts))
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for label, x, y, lo, hi, read in pts:
        ax.errorbar([x], [y], yerr=[[y - lo], [hi - y]], fmt='o', color='C3' if label in front else 'C0',
                    mfc=None if read else 'white', capsize=3, lw=1)
    line = sorted((p for p in pts if p[0] in front), key=lambda p: p[1])
    ax.plot([p[1] for p in line], [p[2] for p in line], '--', color='C3', lw=1, label='Pareto front (mean gain)')
    ax.axhline(0.0, color='grey', lw=0.8)
    ax.set_xlabel('train step time over AdamW\'s (same model, batch, data; median of interleaved repeats)')
    ax.set_ylabel('top-1 gain over AdamW, points (paired by seed, 95 % CI)')
    ax.set_title('What each SAM buys per unit of compute (hollow: claim not read)', fontsize=10)
    ax.legend(loc='lower right', fontsize=8)
    lo, hi = min(p[1] for p in pts), max(p[1] for p in pts)
    ax.set_xlim(lo - 0.05 * (hi - lo + 0.1), hi + 0.25 * (hi - lo + 0.1))  # room for the labels right of the points
    fig.tight_layout()
    _place_labels(fig, ax, [(p[0], p[1], p[2]) for p in pts])  # after the layout: where the labels will be
    fig.savefig(figs / 'cost_gain.png', dpi=110)
    plt.close(fig)
    return ['cost_gain.png']


def _place_labels(fig: Any, ax: Any, pts: Sequence[Tuple[str, float, float]]) -> None:
    """Each point's label beside it, without the "ViT + " every arm shares; points of one mean gain within 0.1 of
    each other's cost share one label. A label that would overlap one placed before moves up or down in steps of its
    height, with a thin line back to its point: the variants at about 2x AdamW's cost sit close together."""
    from matplotlib.text import Text

    groups: List[Tuple[List[str], float, float]] = []
    for label, x, y in sorted(pts, key=lambda p: p[1]):
        short = label.removeprefix('ViT + ')
        near = next((g for g in groups if round(g[2], 2) == round(y, 2) and abs(x - g[1]) <= 0.1), None)
        if near is not None:
            near[0].append(short)
        else:
            groups.append(([short], x, y))
    renderer = fig.canvas.get_renderer()
    placed: List[Any] = []
    steps = (0, -1, 1, -2, 2, -3, 3, -4, 4, -5, 5)
    for names, x, y in sorted(groups, key=lambda g: (-g[2], g[1])):
        for k in steps:
            text = ax.annotate(', '.join(names), (x, y), textcoords='offset points', xytext=(6, 3 + 9 * k),
                               fontsize=7, arrowprops=dict(arrowstyle='-', lw=0.4, color='grey') if k else None)
            text.update_positions(renderer)
            box = Text.get_window_extent(text, renderer)  # the text alone, not its line
            if k == steps[-1] or not any(box.overlaps(b) for b in placed):
                break  # (where every step overlaps, the last one stays: a label is never left out)
            text.remove()
        placed.append(box)


def _claim_cell(d: SeedDecision, c: Optional[ClaimResult]) -> str:
    if d.status == 'read' and c is not None:
        return f'{format_difference(c.diff, *PT)}, {c.agree}/{c.n} agree, **{c.label}**'
    if d.status == 'read':
        return f'not read: its rule gave it {d.n} seeds, and not all of their runs are there (failed or not trained)'
    if d.status == 'dropped':
        return f'dropped: {d.why}'
    return f'out of reach: {d.why}'


def cost_gain_section(rev: RevisionPlan, r: Results, adamw: Sequence[Dict[str, Any]], sam: Sequence[Dict[str, Any]],
                      labels: Dict[str, str], decisions: Sequence[SeedDecision], read: Dict[str, ClaimResult],
                      step_cost: Optional[Dict[str, Any]], failed: Dict[str, Dict[str, Any]],
                      stopped: Sequence[Dict[str, Any]], status: Tuple[str, ...], fig_dir: Path,
                      fig_link: str) -> List[str]:
    """The section: ``r`` holds the revision's arms' runs at their seeds (and the check's), ``adamw`` and ``sam`` the
    reused pair, ``decisions`` the rule's, ``read`` each read claim by key, ``step_cost`` what step_cost.py saved,
    ``failed`` and ``stopped`` every run that failed or was stopped, ``status`` the registration label, why and the
    record's note; the plot goes to ``fig_dir``, linked as ``fig_link``."""
    by_arm = {CLAIM_BY_KEY[d.key].b: d for d in decisions}
    cost = {row['arm']: row for row in (step_cost or {}).get('rows', [])}
    check_arm, check_seed = R5_CHECK
    check = next((m for m in r.get(check_arm.name, []) if m['seed'] == check_seed), None)
    ref = next((m for m in adamw if m['seed'] == check_seed), None)
    lines = [f'## {TITLE}', '',
             f'Revision 5 of the plan trains {len(rev.arms)} arms, every SAM-family optimizer timm-ext ships but SAM '
             'itself, on revision 4\'s ViT, data and settings at its 120 epochs, each at the settings its paper gives '
             '(or the nearest documented ones; `reproduction/plan.py`, `R5_ARMS`), and reads each against revision '
             f'4\'s AdamW and SAM runs, reused as they are, paired by seed. By the standard of [the revisions\' table]'
             f'(#revisions-and-what-each-had-seen) it is **{status[0]}** ({status[1]}'
             + (f'; {status[2]}' if len(status) > 2 and status[2] else '') + '). Its claims, margins, its pilot '
             '(seeds 0-2 of every arm), the power rule that fixed each claim\'s seeds from the pilot alone and the '
             f'CPU budget ({R5_BUDGET_CPU_MIN:.0f} CPU-minutes, spent in the plan\'s order, the cheap variants first) '
             'were committed before its first run.', '']
    if check is not None and ref is not None:
        same = check['top1_curve'] == ref['top1_curve']
        differ = sum(x != y for x, y in zip(check['top1_curve'], ref['top1_curve']))
        lines += [f'The check before the pilot: revision 4\'s AdamW run at seed {check_seed}, trained again here'
                  f'{_on(check)}, ends at {check["top1"]:.2f} % top-1 against the reused run\'s '
                  f'{ref["top1"]:.2f} % '
                  + ('with the same curve: the reused runs are what this machine trains.' if same else
                     f'and its curve differs in {differ} of {len(ref["top1_curve"])} epochs: the reused runs were '
                     f'trained{_on(ref) or " elsewhere"}, so each pair below spans two machines (the same initial '
                     'weights and data order, different floating-point paths). That adds the machines\' difference to '
                     'each paired difference as noise, not as a bias one could name a sign for; the claims are read '
                     'with it.'), '']
    rows = ['| optimizer | passes / step | step time / AdamW (wall; CPU) | seeds | top-1 (%) | gain over AdamW, '
            'mean [95 % CI] | share of SAM\'s gain | claim against SAM: mean [95 % CI], verdict | converged | '
            'CPU min / run |', '|---|---:|---|---:|---|---|---:|---|---|---:|']
    gains: Dict[str, PairedDifference] = {}
    for name, ms in ((a_name, ms) for a_name, ms in (('vit_x2', adamw), ('vit_sam_x2', sam), *(
            (n, r.get(n, [])) for n in rev.arms))):
        if not ms:
            continue
        g = gain(ms, adamw) if name != 'vit_x2' else None
        if g is not None:
            gains[name] = g
        c = cost.get(name)
        d = by_arm.get(name)
        cpus = [m['timing']['cpu_s'] / 60 for m in ms if (m.get('timing') or {}).get('cpu_s') is not None]
        rows.append(
            f'| {labels.get(name, name)} | {c["passes"]:.2f} | {c["ratio"]:.2f}; {c["ratio_cpu"]:.2f} | '
            if c else f'| {labels.get(name, name)} | | | ')
        rows[-1] += (f'{len(ms)} | {mean_sd([m["top1"] for m in ms], ".2f")} | '
                     + (format_difference(g, *PT) if g is not None else '(reference)') + ' | '
                     + (f'{share(ms, adamw, sam):.2f}' if name != 'vit_x2' else '') + ' | '
                     + (_claim_cell(d, read.get(d.key)) if d is not None else '(reference)') + ' | '
                     + f'{converged_cell(ms)} | ' + (f'{statistics.fmean(cpus):.1f}' if cpus else '') + ' |')
    lines += rows + ['']
    read_names = [CLAIM_BY_KEY[d.key].b for d in decisions if d.status == 'read'] + ['vit_sam_x2']
    dropped = [n for n in (CLAIM_BY_KEY[d.key].b for d in decisions if d.status == 'dropped') if n in gains]
    # an arm the pilot dropped did not train this model: its "gain" is no price of anything, and off the plot's scale
    pts = points(labels, {n: row['ratio'] for n, row in cost.items()},
                 {n: g for n, g in gains.items() if n not in dropped}, read_names)
    if draw_cost_gain(pts, fig_dir):
        lines += [f'![gain over AdamW against step cost]({fig_link}/cost_gain.png)', '',
                  'On the Pareto front (no other optimizer both cheaper per step and higher in mean gain): '
                  + ', '.join(pareto(pts)) + '. The front is drawn through the means; the intervals overlap, and '
                  'only the claims read above say more than their means.'
                  + (' Not drawn, and not on the front: the arms the pilot dropped, which did not train this model ('
                     + ', '.join(f'{labels.get(n, n)} {format_difference(gains[n], *PT)}' for n in dropped) + ').'
                     if dropped else ''), '']
    kept = [d for d in decisions if d.status != 'dropped']
    pilot_sd = _pilot_sd(r, sam, rev, [CLAIM_BY_KEY[d.key].b for d in kept])
    lines += [f'The rule on the pilot: the differences to SAM pooled over the {len(kept)} kept arms have a standard '
              f'deviation of {pilot_sd:.2f} pt; each claim\'s seeds and what became of it: '
              + '; '.join(f'{labels.get(CLAIM_BY_KEY[d.key].b, d.key)} {d.status} ({d.why})' for d in decisions)
              + '.', '']
    runs = [m for n in (check_arm.name, *rev.arms) for m in r.get(n, [])]
    spent = spend(runs)
    if spent:
        lines += [f'Revision 5: {spent}; {cpu_of(runs)}.', '']
    if failed or stopped:
        lines += ['Runs that failed (kept with why, never trained again): '
                  + ('; '.join(f'{k}: {v["why"]}' for k, v in failed.items()) or 'none') + '. Runs stopped unfinished '
                  'and trained again: ' + ('; '.join(f'{s["run"]} after {s["epochs"]} epochs ({s["last_written"]} '
                                                     'UTC)' for s in stopped) or 'none') + '.', '']
    return lines


def _on(m: Dict[str, Any]) -> str:
    """' on <CPU>' as the run recorded it, or nothing."""
    return f' on {m["cpu"]}' if m.get('cpu') else ''


def _pilot_sd(r: Results, sam: Sequence[Dict[str, Any]], rev: RevisionPlan, arms: Sequence[str]) -> float:
    s = _top1(sam)
    groups = [[m['top1'] - s[m['seed']] for m in r.get(a, []) if m['seed'] in rev.seeds] for a in arms]
    groups = [g for g in groups if len(g) > 1]
    return pooled_sd(groups) if groups else float('nan')


def load_revision(rev: RevisionPlan, runs: Path, archive: Any, pair: Results, failed_archived: Dict[str, Any],
                  ) -> Tuple[Results, Dict[str, Dict[str, Any]], List[SeedDecision], Dict[str, ClaimResult]]:
    """A revision with a seed rule, read back: its runs (the cache first, then ``archive``) at the seeds its rule gave
    each arm, the failed runs (the cache's records, then ``failed_archived``), the rule's decisions on its pilot and
    each read claim. ``pair`` holds the reused AdamW and SAM runs by arm. Nothing is read before its pilot is done."""
    import json

    from claims import read
    from run_results import in_cache, load_results
    from study_jobs import FAILED_FILE, decide
    from supporting_runs import ALL_ARMS_BY_NAME

    check_arm, check_seed = R5_CHECK
    failed = dict(failed_archived)
    for name in (check_arm.name, *rev.arms):
        for folder in runs.glob(f'{name}-s*'):
            if (folder / FAILED_FILE).is_file() and folder.name.rsplit('-s', 1)[0] == name:
                failed[folder.name] = json.loads((folder / FAILED_FILE).read_text())
    arms = [check_arm, *(ALL_ARMS_BY_NAME[n] for n in rev.arms)]

    def ran(name: str, seed: int) -> bool:  # what has run: a claim is read only once all of its seeds have
        return f'{name}-s{seed}' not in failed and (in_cache(runs, name, seed) or (name, seed) in (archive or {}))

    pilot = {a.name: [s for s in ((check_seed,) if a is check_arm else rev.seeds) if ran(a.name, s)] for a in arms}
    if sum(map(len, pilot.values())) + len(failed) < 1 + len(rev.arms) * len(rev.seeds):
        return {}, failed, [], {}  # its pilot is not done: nothing to read yet
    r = load_results(runs, arms, rev.seeds, archive, pilot)
    done: Dict[Tuple[str, int], Dict[str, Any]] = {}
    for name, ms in r.items():
        for m in ms:
            done[name, m['seed']] = dict(failed=None, top1=m['top1'], cpu_s=(m.get('timing') or {}).get('cpu_s'))
    for key, rec in failed.items():
        name, seed = key.rsplit('-s', 1)
        done[name, int(seed)] = dict(failed=rec['why'], top1=None, cpu_s=rec.get('cpu_s'))
    reference = {(name, m['seed']): m for name, ms in pair.items() for m in ms}
    decisions = decide(rev, done, reference)
    n_of = {CLAIM_BY_KEY[d.key].b: d.n for d in decisions if d.status == 'read'}
    seeds_of = {a.name: [s for s in (range(n_of[a.name]) if a.name in n_of else pilot[a.name]) if ran(a.name, s)]
                for a in arms}
    r = load_results(runs, arms, rev.seeds, archive, seeds_of)
    whole = {d.key: d.n for d in decisions if d.status == 'read'
             and len(seeds_of[CLAIM_BY_KEY[d.key].b]) == d.n}  # a claim one of whose runs failed is not read
    readings = read({**r, **pair}, [CLAIM_BY_KEY[k] for k in whole], whole, revision=rev.name)
    return r, failed, decisions, {c.claim.key: c for c in readings}
