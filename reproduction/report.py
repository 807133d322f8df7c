"""docs/reproduction.md from the study's cached measurements: the claims table first, then the evidence.

Each claim of ``plan.CLAIMS`` becomes a paired difference over the seeds with its 95 % t interval and
a verdict by the rule fixed before the runs (:mod:`claims`); the tables come from :mod:`report_tables`,
the plots from :mod:`figures` (every seed drawn), the paragraphs on failed claims from :mod:`why_failed`.
``measurements.json`` keeps every number and every run's train.py settings.
"""
import json
import math
import os
import statistics
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from claims import ClaimResult, read, read_revision
from convergence_text import DOUBLED, converged_cell, doubling_text, judged, rule_count, rule_text
from cost_gain import cost_gain_section, load_revision
from figures import STEM_LRS, draw_extended, draw_plots
from longer_schedules import LONG_ARMS
from looksam_reuse import paragraph as reuse_paragraph
from plan import (
    ARMS,
    EPOCHS,
    LONG_CLAIM,
    LONG_PAIR,
    LONG_REUSED,
    LONG_SEEDS,
    PLAN_BY_NAME,
    PLANS,
    R5_ADAMW,
    R5_ARMS,
    R5_CHECK,
    R5_SAM,
    SAM_RHO,
    VIT_EPOCHS,
    Arm,
    extended_seeds,
)
from readings import extended_cell, headline, powers
from registration import REVISIONS, STANDARD, label, revisions_table
from report_tables import (
    accuracy_table,
    claim_fmt,
    claims_table,
    mean_sd,
    not_converged,
    per_seed_row,
    schedule_text,
    seed_values,
    support_table,
)
from run_ledger import EARLIER, ledger_section
from run_metrics import deep_layers, delta_pi, early_epoch, mean_over
from run_results import (
    Archive,
    Results,
    first_schedules,
    in_cache,
    load_results,
    long_archive,
    longer_runs,
    unique_runs,
)
from run_times import cpu_of, spend
from sections import ONE_SCHEDULE_TITLE, revision_sections
from study_jobs import stopped_runs, unique_stops
from why_failed import why_paragraphs

from timm_ext.analysis.stats import VERDICT_RULE, format_difference, paired_difference
from timm_ext.machine import cpu_name

FIGS = 'reproduction'
FAILED_KEY, STOPPED_KEY = 'failed_runs', 'stopped_runs'  # measurements.json: every run that failed or was stopped
REVISIONS_TITLE = 'Revisions, and what each had seen'
PLAN_FILE = 'reproduction/plan.py'  # the pre-registration, from the repository's root
VALIDATION_IMAGES = 359  # the digits' validation split (1,797 images, 20 %): one image is 100 / 359 points of top-1
# v3's runs (seeds 0-4), as its report gave them: revision 3 reads them back from measurements.json, not the cache
V3_TIMING = dict(runs=109, wall_min=234.0, first='2026-11-26 20:30', last='2026-11-26 22:36')


def _plan_commit() -> str:
    """The commit that last changed the content of ``plan.py`` (the pre-registration), or '?' outside git.

    Renames are followed and a pure move is not a change (``--diff-filter=AM``): the plan moved from
    ``benchmarks/_repro_plan.py`` unchanged, and the commit that fixed its last revision stays the one named.
    """
    try:
        return subprocess.run(['git', 'log', '-1', '--follow', '--diff-filter=AM', '--format=%h %cs', '--', PLAN_FILE],
                              capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
                              timeout=10).stdout.strip() or '?'
    except (OSError, subprocess.SubprocessError):
        return '?'


def _version(name: str) -> str:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return '?'


def _sections(r: Results, claims: Dict[str, ClaimResult], labels: Dict[str, str], figs: List[str],
              r_final: Optional[Results] = None, again_24: Optional[Dict[str, ClaimResult]] = None) -> List[str]:
    """The sections per paper: ``r`` every run at its first schedule; ``r_final`` with revision 2.4's runs at twice
    the schedule in place, shown beside where its reading (``again_24``) differs. Every table of runs has a
    "converged" column naming the runs that miss the rule."""
    r_final = r_final if r_final is not None else r
    again_24 = again_24 or {}
    lines: List[str] = []
    add = lines.extend

    def img(name: str, alt: str) -> List[str]:
        return [f'![{alt}]({FIGS}/{name})'] if name in figs else []

    def claim_line(key: str) -> str:
        c = claims.get(key)
        if c is None:
            return ''
        text = c.claim.text[:1].upper() + c.claim.text[1:]
        return (f'{text}: {format_difference(c.diff, claim_fmt(c.claim), c.claim.unit)}, {c.agree}/{c.n} seeds '
                f'agree: {c.verdict_text()}.')

    if 'vit' in r and 'vit_sam' in r:
        add(['## vit-sam: SAM on a ViT and a ResNet, with less data', ''])
        rows = [('ViT, all data', 'vit', 'vit_sam'), ('ViT, 1/2', 'vit_half', 'vit_sam_half'),
                ('ViT, 1/4', 'vit_quarter', 'vit_sam_quarter'), ('ResNet-18/4, all data', 'resnet', 'resnet_sam')]
        add(['| setting | AdamW top-1 | SAM top-1 | SAM - AdamW, mean [95 % CI] | seeds agree | converged (AdamW; '
             'SAM) |', '|---|---|---|---|---|---|'])
        for name, a, b in rows:
            if a in r and b in r:
                d = paired_difference([m['top1'] for m in r[a]], [m['top1'] for m in r[b]])
                up = sum(x > 0 for x in d.diffs)
                add([f'| {name} | {mean_sd([m["top1"] for m in r[a]])} | {mean_sd([m["top1"] for m in r[b]])} | '
                     f'{format_difference(d, ".2f", " pt")} | {up}/{d.n} higher | {converged_cell(r[a])}; '
                     f'{converged_cell(r[b])} |'])
        add(['', *img('sam_top1_fraction.png', 'top-1 against data'), ''])
        add(['Table 1 and Fig. 2 quantities on the ViT (64 training images; `lambda_max` by power iteration, '
             '`L_train^N` over 10 draws of Gaussian weight noise of std 0.05, the paper does not give its sigma):', '',
             '| | ViT + AdamW | ViT + SAM |', '|---|---|---|'])
        for name, fn in (('`lambda_max`', lambda m: m['lambda_max']), ('`L_train` (clean)', lambda m: m['train_loss']),
                         ('`L_train^N`', lambda m: m['noisy_loss']),
                         ('active neurons, block 1', lambda m: next(iter(m['activity'].values())))):
            add([f'| {name} | {per_seed_row(r, "vit", fn)} | {per_seed_row(r, "vit_sam", fn)} |'])
        add([f'| converged | {converged_cell(r["vit"])} | {converged_cell(r["vit_sam"])} |'])
        add(['', *[claim_line(k) for k in ('sam_lambda_max', 'sam_noisy_loss', 'sam_active_neurons') if k in claims],
             '', *img('sam_activity.png', 'active neurons per block'), ''])
    if 'vit_convstem' in r:
        add(['## scaled-relu: the conv stem against patchify over learning rates', ''])
        add(['| lr (AdamW, 1 warmup epoch) | epochs | patchify top-1 | conv stem top-1 | patchify runs below 20 % | '
             'conv - patchify, mean [95 % CI] | converged (patchify; conv stem) |', '|---|---|---|---|---|---|---|'])
        for lr, a, b in STEM_LRS:
            for name, rr in ((lr, r), (f'{lr}, revision 2.4 (sensitivity reading)', r_final)):
                if a not in rr or b not in rr or (rr is r_final and rr[a] == r[a] and rr[b] == r[b]):
                    continue
                pa, pb = [m['top1'] for m in rr[a]], [m['top1'] for m in rr[b]]
                add([f'| {name} | {schedule_text(rr[a])} | {mean_sd(pa)} ({seed_values(pa)}) | '
                     f'{mean_sd(pb)} ({seed_values(pb)}) | {sum(v < 20 for v in pa)}/{len(pa)} | '
                     f'{format_difference(paired_difference(pa, pb), ".2f", " pt")} | {converged_cell(rr[a])}; '
                     f'{converged_cell(rr[b])} |'])
        e = early_epoch(r['vit'][0])
        add(['', f'Early convergence, top-1 after epoch {e} of {len(r["vit"][0]["top1_curve"])} at lr 1e-3: patchify '
             f'{per_seed_row(r, "vit", lambda m: m["top1_curve"][e - 1], ".1f")}, conv stem '
             f'{per_seed_row(r, "vit_convstem", lambda m: m["top1_curve"][e - 1], ".1f")}. '
             f'{claim_line("stem_early")}', ''])
        add([*img('stem_top1_lr1e-3.png', 'top-1 per epoch, lr 1e-3'), *img('stem_top1_lr1.5e-3.png', 'lr 1.5e-3'),
             ''])
        stem = lambda m: m['tokens']['patch_embed']  # noqa: E731
        add([f'Token similarity after the stem: patchify {per_seed_row(r, "vit", stem)}'
             f', conv stem {per_seed_row(r, "vit_convstem", stem)}. '
             f'{claim_line("stem_tokens")}', '', *img('stem_tokens.png', 'token similarity per layer'), ''])
    if 'vit_cb' in r:
        deep = deep_layers(r)
        add(['## context-broadcasting: attention entropy and distance', ''])
        add([f'Entropy (nats) of the attention rows in the CB layers ({", ".join(str(i + 1) for i in deep)} of '
             f'{len(r["vit"][0]["entropy"])}), averaged over heads and 128 validation images; the uniform bound is '
             f'log 17 = {r["vit"][0]["max_entropy"]:.2f}. The dose-response arm puts CB in every block.', '',
             '| | class token, CB layers | all queries, CB layers | all queries, every layer | distance, CB layers '
             '| top-1 | converged |', '|---|---|---|---|---|---|---|'])
        for arm in ('vit', 'vit_cb', 'vit_cb_all'):
            if arm in r:
                add([f'| {labels[arm]} | {per_seed_row(r, arm, lambda m: mean_over(m["cls_entropy"], deep))} | '
                     f'{per_seed_row(r, arm, lambda m: mean_over(m["entropy"], deep))} | '
                     f'{per_seed_row(r, arm, lambda m: statistics.fmean(m["entropy"]))} | '
                     f'{per_seed_row(r, arm, lambda m: mean_over(m["distance"], deep))} | '
                     f'{mean_sd([m["top1"] for m in r[arm]])} | {converged_cell(r[arm])} |'])
        add(['', *[claim_line(k) for k in ('cb_entropy_cls', 'cb_entropy_all', 'cb_distance', 'cb_top1')], ''])
        add([*img('cb_cls_entropy.png', 'class-token entropy per layer'), *img('cb_entropy.png', 'entropy per layer'),
             *img('cb_distance.png', 'distance per layer'), ''])
    if 'alternet' in r and 'resnet' in r:
        add(['## how-do-vits-work: MSAs as low-pass filters, feature-map variance, Hessian spectra', ''])
        add(['Per block, the log of the feature-map variance after it over the variance before it (the official '
             '`featuremap_variance.ipynb`: spatial variance per image and channel, averaged), and the change of the '
             'Delta log amplitude at pi over the block (`fourier_analysis.ipynb`), on 128 validation images.', '',
             '| model | blocks | log variance ratio, mean over blocks | ratio < 1 | change of Delta at pi | '
             'converged |',
             '|---|---|---|---|---|---|'])
        for arm in ('resnet', 'alternet', 'vit'):
            if arm not in r or 'kinds' not in r[arm][0]:
                continue
            kinds = r[arm][0]['kinds']
            for kind in ('msa', 'mlp', 'conv'):
                blocks = [n for n, k in kinds.items() if k == kind and n in r[arm][0]['variance_ratio']]
                if not blocks:
                    continue
                logs = [statistics.fmean(math.log(m['variance_ratio'][b]) for b in blocks) for m in r[arm]]
                below = sum(m['variance_ratio'][b] < 1 for m in r[arm] for b in blocks)
                dpi = [statistics.fmean(delta_pi(m, b) for b in blocks) for m in r[arm]]
                add([f'| {labels[arm]} | {kind} ({len(blocks)}) | {mean_sd(logs, ".3f")} | '
                     f'{below}/{len(blocks) * len(r[arm])} | {mean_sd(dpi, ".3f")} | {converged_cell(r[arm])} |'])
        add(['', claim_line('msa_variance'), claim_line('msa_lowpass'), ''])
        add([*img('alternet_variance.png', 'variance, AlterNet'), *img('resnet_variance.png', 'variance, ResNet'),
             *img('vit_variance.png', 'variance, ViT'), ''])
        add(['Hessian max eigenvalue spectra as the paper\'s issue #12 describes them (top-5 eigenvalues of each '
             'mini-batch of 16 training images by power iteration, L2 of weight decay 0.05 added, 4 batches a run, '
             'pooled over the seeds). NEP: share of negative eigenvalues; APE: mean of the positive ones.', '',
             '| model | NEP | APE | `lambda_max` (64 images) | converged |', '|---|---|---|---|---|'])
        for arm in ('resnet', 'alternet', 'vit', 'vit_quarter'):
            if arm in r and 'nep' in r[arm][0]:
                add([f'| {labels[arm]} | {per_seed_row(r, arm, lambda m: m["nep"])} | '
                     f'{per_seed_row(r, arm, lambda m: m["ape"], ".1f")} | '
                     f'{per_seed_row(r, arm, lambda m: m["lambda_max"], ".1f")} | {converged_cell(r[arm])} |'])
        add(['', *[claim_line(k) for k in ('hessian_vit_nep', 'hessian_vit_ape', 'hessian_small_data_nep',
                                           'alternet_ape')], '', *img('hessian_spectrum.png', 'Hessian spectra'),
             *img('hessian_spectrum_warmup.png', 'Hessian spectra at the end of warmup'), ''])
    return [x for x in lines if x is not None]


def _anchor(title: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return ''.join(ch for ch in title.lower() if ch.isalnum() or ch in ' -').replace(' ', '-')


def _convergence_paragraph(r: Results, r_final: Results, r_ext: Optional[Results], r_long: Optional[Results],
                           seeds: Sequence[int], earlier: Optional[Results]) -> str:
    """The rule, and how many runs meet it by the study's parts, every run that misses it named; then the vit-sam
    paper's doubling test, which is stricter (issue 57: "converged" is a label of the rule, not of the runs)."""
    main = {a.name for a in ARMS}
    parts = [f'the claims\' runs at seeds {", ".join(map(str, seeds))}, each at its first schedule: '
             + rule_count([m for k, v in r.items() if k in main for m in v])]
    again = longer_runs([m for k, v in r_final.items() if k in main for m in v])
    if again:
        parts.append('revision 2.4\'s runs at twice the schedule: ' + rule_count(again))
    new = [m for ms in (r_ext or {}).values() for m in ms if m['seed'] not in seeds]
    if new:
        parts.append('revision 3\'s new seeds at their first schedule: '
                     + rule_count(first_schedules({'new': new})['new']))
        if longer_runs(new):
            parts.append('revision 3.1\'s runs at twice the schedule: ' + rule_count(longer_runs(new)))
    if r_long:
        parts.append('revision 4\'s pair at 120 epochs: ' + rule_count([m for ms in r_long.values() for m in ms]))
    support = [m for k, v in r.items() if k not in main for m in v]
    if judged(support):
        parts.append('the supporting runs: ' + rule_count(support) + ' (the end-of-warmup checkpoints, 1 epoch, are '
                     'not judged)')
    if earlier:
        parts.append('revision 2.2\'s withdrawn lr 2e-3 pair: ' + rule_count([m for v in earlier.values() for m in v]))
    pairs = [(label, r[short], r[full]) for label, short, full in DOUBLED if short in r and full in r]
    if r_long and r_ext:
        first = first_schedules(r_ext)
        pairs += [(arm.label.split(',')[0], first[name], r_long[arm.name]) for name, arm in zip(LONG_PAIR, LONG_ARMS)
                  if name in first and arm.name in r_long]
    return (f'**Converged** means {rule_text()}, and nothing more: it is a label of this rule. By it: '
            + '; '.join(parts) + '. '
            f'One validation image is {100 / VALIDATION_IMAGES:.3f} points of top-1, so the rule\'s tolerance is 2 '
            'images and a claim\'s 1-point margin between 3 and 4. The same validation images decide whether a run '
            'meets the rule and give the top-1 the claims read (the digits have no third split): where a rule trains '
            'a seed again because a run missed it (revisions 2.4 and 3.1), it acts on the images the claim is then '
            'read on. Top-1 is the last epoch\'s, never the best one. Revision 2.1 kept this rule and doubled the '
            'ViTs\' schedule after v2, where 21 of 80 runs missed it; revision 2.2 moved the sweep\'s second learning '
            'rate from 3e-3, where 7 of 10 runs were still improving after 60 epochs (patchify all 5), to 2e-3, and '
            'revision 2.3 to 1.5e-3, after 3 of the 10 runs at 2e-3 missed it; revision 2.4 trains a seed of that '
            'pair again at twice the schedule where one of its runs misses it, and revision 3.1 did the same for the '
            'ViT arms at revision 3\'s new seeds; both were written after a run they read again had missed the rule, '
            'so their readings are sensitivity readings, beside the first readings, which name the runs that miss '
            'it. Revision 4 trains the ViT pair at 120 epochs for every seed and names, not replaces, a run that '
            'misses the rule. [The revisions\' table](#revisions-and-what-each-had-seen) gives each one\'s label. '
            + doubling_text(pairs))


def _timing_text(r_all: Results) -> str:
    """Where the runs' time went: wall-clock from each run's recorded times, CPU time where recorded; v3's runs
    (seeds 0-4, read back from its measurements.json, which recorded no times) as v3's report gave them."""
    every = unique_runs([m for ms in r_all.values() for m in ms])
    untimed = sum('timing' not in m for m in every)
    text = ''
    if untimed:
        text += (f' The {V3_TIMING["runs"]} runs of v3 (seeds 0-4, read back from its measurements.json) took '
                 f'{V3_TIMING["wall_min"]:.0f} min of wall-clock time summed over the runs, trained between '
                 f'{V3_TIMING["first"]} and {V3_TIMING["last"]} UTC, as its report gave them, which called it CPU '
                 'time; no run recorded CPU time or a CPU model.' if untimed == V3_TIMING['runs'] else
                 f' {untimed} runs read back from an earlier report have no recorded times.')
    timed = spend([m for m in every if 'timing' in m])
    if timed:
        text += f' {"The" if not untimed else "The other"} {timed} (times from the files of their cache).'
    return text


def _sensitivity_cells(again_24: Dict[str, ClaimResult], again_31: Dict[str, ClaimResult]) -> Dict[str, str]:
    """The claims table's column of post-hoc readings: revision 2.4's (5 seeds) and revision 3.1's (more seeds)."""
    def cell(rev: str, c: ClaimResult) -> str:
        return f'revision {rev}, {c.n} seeds: {format_difference(c.diff, claim_fmt(c.claim), c.claim.unit)}, ' \
               f'{c.verdict_text()}'

    return {**{k: cell('2.4', c) for k, c in again_24.items()}, **{k: cell('3.1', c) for k, c in again_31.items()}}


def report_text(r: Results, arms: Sequence[Arm], seeds: Sequence[int], claims: List[ClaimResult], figs: List[str],
                command: str, wall_s: float, trained: int, load: Optional[Tuple[float, float]],
                why: Optional[List[str]] = None, extended: Sequence[ClaimResult] = (),
                r_ext: Optional[Results] = None, archived: bool = False,
                sensitivity: Sequence[ClaimResult] = (), long: Optional[ClaimResult] = None,
                r_long: Optional[Results] = None, r_final: Optional[Results] = None,
                again_24: Sequence[ClaimResult] = (), long_unseen: Optional[ClaimResult] = None,
                earlier: Optional[Results] = None, sections: Sequence[str] = (),
                revisions: Sequence[str] = (), r5: Optional[Results] = None) -> str:
    """The report. ``r``: seeds 0-4, every run at its first schedule (the first readings, ``claims``); ``r_final``:
    the same with revision 2.4's runs at twice the schedule in place (``again_24``, its sensitivity readings);
    ``extended``: revision 3's claims as registered (every run at its first schedule); ``sensitivity``: revision
    3.1's reading of them; ``long``, ``long_unseen`` and ``r_long``: revision 4's pair at 120 epochs, read at every
    seed and at the seeds it had not seen; ``earlier``: runs of withdrawn arms, read by no claim; ``revisions``: the
    plan's revisions the report is as of, each with a section of its own where it has one (``sections.SECTIONS``;
    ``sections``: revision 5's lines; ``r5``: its runs, counted among those the report reads)."""
    r_final = r_final if r_final is not None else r
    labels = {a.name: a.label for a in arms}
    ext = {c.claim.key: c for c in extended}
    again = {c.claim.key: c for c in sensitivity}
    power = powers(claims) if extended else {}
    r_all = {**r_final, **(r_ext or {}), **(r_long or {})}
    main = {a.name for a in ARMS}
    most = max((c.n for c in extended), default=len(seeds))
    retrained_seeds = sorted({m['seed'] for ms in (r_ext or {}).values() for m in ms
                              if 'replaced' in m and m['seed'] not in seeds})
    reused = [x['run'] for x in longer_runs([m for ms in (r_ext or {}).values() for m in ms])]
    n_reused = sum(m.get('run') in set(reused) for ms in (r_long or {}).values() for m in ms)
    sens_cells = _sensitivity_cells({c.claim.key: c for c in again_24}, again)
    lines = [
        f'# The papers\' claims on real digits: {len(seeds)} seeds'
        + (f', up to {most} where more seeds can settle a claim' if extended else ''), '',
        '[Docs index](index.md) · [analysis toolkit](analysis.md) · [statistics](analysis.md#comparing-two-arms)', '',
        headline(claims, ext, again, long, retrained_seeds, long_unseen, n_reused) + ' Each row is a '
        'paired difference over the seeds (second arm minus first, same seed), its 95 % t interval, and the verdict '
        'by the rule below, every run read at its first schedule; a run that misses the convergence rule is named '
        'where its claim is read ([the rule](#setting))'
        + ('; the revision-3 column reads the claims within reach at the number of seeds fixed before their runs, '
           'as registered ([below](#more-seeds-where-more-seeds-can-settle-a-claim-revision-3))' if extended else '')
        + ('; the sensitivity column gives the readings of revisions written after a run they read again had '
           'missed the rule (2.4, 3.1)' if sens_cells else '')
        + (f'; revision 4\'s pair at 120 epochs has [a section of its own](#{_anchor(ONE_SCHEDULE_TITLE)})'
           if long else '')
        + '. The last two columns are the verdicts of v2 (every arm 30 epochs, 5 seeds, the same '
        'rule) and of v1 (6 epochs, 3 seeds, "holds in every seed").',
        '', *claims_table(claims, {c.claim.key: extended_cell(c.claim.key, c, ext, power) for c in claims}
                          if extended else None, sens_cells if sens_cells else None),
        '', f'![every claim, every seed]({FIGS}/claims.png)', '',
        '**Verdict rule** (`timm_ext.analysis.stats`, whose `VERDICT_RULE` this quotes; the claims, their margins, '
        'the convergence rule and each revision of the study live in `reproduction/plan.py`, last changed in '
        f'{_plan_commit()}; whether each revision counts as registered is [a table of its own, by one standard]'
        f'(#revisions-and-what-each-had-seen)): {VERDICT_RULE} A claim of no effect ("unchanged") is '
        'reproduced when the interval lies inside (-margin, +margin), not reproduced when it lies beyond the margin, '
        'and inconclusive otherwise. The label "smaller than claimed" came with revision 4, before its runs but '
        'after every earlier verdict was read; until then the sign was checked first, and such an interval read '
        '"reproduced" while it also met "not reproduced". Every claim gets the new label, and the old one is shown '
        'beside it wherever the two differ. The margin is the smallest effect each claim cares about: 1 point of '
        f'top-1 (between 3 and 4 of the {VALIDATION_IMAGES} validation images), 0.05 nats of entropy, 0.1 in log '
        '`lambda_max` / log APE (about 10 %), 0.05 of NEP, 0.01 of the active share.', '',
        '## Setting', '',
        'scikit-learn\'s 1,797 handwritten digits (`timm_ext.data`), 16 px: 1,438 training and 359 validation '
        'images; the 1/2 and 1/4 arms keep a stratified, nested share of the training images '
        '(`digits_subset_folder`) and train for 2x and 4x the epochs, the same number of steps. Every run is timm\'s '
        'own `train.py` with the plugin, one CPU thread: batch 16, AdamW (lr 1e-3 unless the arm says), weight decay '
        '0.05, cosine schedule with 1 warmup epoch, label smoothing 0.1 (timm\'s default), random-resized crop '
        '(scale 0.6-1) and no other augmentation: the vit-sam paper\'s "Inception-style" regime without the flip, '
        f'since a mirrored digit is another glyph. {VIT_EPOCHS} epochs on the full data for the ViTs, {EPOCHS} for the '
        'CNNs (revision 2.1 doubled the ViTs\' 30: see the convergence rule below). The ViTs are the demo\'s (patch '
        '4, width 128, 4 blocks of 4 heads; CB in blocks 3-4, or every block for the dose-response arm); the CNNs '
        'are ResNet-18 shapes at a quarter of the width (CIFAR stem), AlterNet with one local MSA block at the end of '
        f'stages 2-4. SAM is `samadamw` with rho {SAM_RHO}. Seeds {", ".join(map(str, seeds))}: arms that share an '
        'architecture share their initial weights and data order for a seed. Measurements (`timm_ext.analysis`) '
        'use each run\'s last checkpoint and the same images for every run of a seed.', '',
        _convergence_paragraph(r, r_final, r_ext, r_long, seeds, earlier), '',
        f'Regenerated by `{command}` on {time.strftime("%Y-%m-%d")}: timm {_version("timm")}, torch '
        f'{torch.__version__}, {os.cpu_count()} cores of {cpu_name()}; this invocation took {wall_s / 60:.1f} min '
        'and trained '
        f'{trained} of the {len(unique_runs([m for v in (*r_all.values(), *(r5 or {}).values()) for m in v]))} '
        'runs it reads (the others came from the cache'
        + (' or were read back from the earlier report\'s measurements.json' if archived else '')
        + ')' + (f'; 5-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end.' if load else '.')
        + _timing_text(r_all) + (f' Revision 5\'s {len(unique_runs([m for v in r5.values() for m in v]))} runs: '
                                 '[in its section](#what-each-sam-buys-per-unit-of-compute-revision-5).' if r5 else ''),
        '',
        *revision_sections(revisions if extended else (), dict(
            r=r, r_ext=r_ext, r_long=r_long, claims=claims, ext=ext, power=power, again=again, figs=figs,
            fig_link=FIGS, revision_time=_revision_time(r_ext or {}, seeds), long=long, reused=reused,
            long_unseen=long_unseen, cost_gain=sections)),
        '## Accuracy of every run', '', *accuracy_table(r, [a for a in arms if a.name in main]), '',
        *not_converged(r, r_final, [a for a in arms if a.name in main]),
        *(['Supporting runs (`reproduction/supporting_runs.py`; no verdicts): v2\'s 30-epoch schedules of the ViTs '
           '(the doubling test above, training length, CB depth) and end-of-warmup checkpoints (where '
           'how-do-vits-work reads its Hessian spectra):', '',
           *support_table(r, [a for a in arms if a.name not in main]), '']
          if any(a.name not in main for a in arms) else []),
        *_sections(r, {c.claim.key: c for c in claims}, labels, figs, r_final, {c.claim.key: c for c in again_24}),
    ]
    if why:
        lines += ['## Why the claims that fail here fail', '',
                  *(['These paragraphs read the 5-seed study (seeds 0-4), every run at its first schedule; revision '
                     '3\'s readings at more seeds are in the section on it above.', ''] if extended else []), *why, '']
    lines += [f'## {REVISIONS_TITLE}', '', STANDARD, '', *revisions_table(), '',
              *ledger_section(earlier or {}),
              '## Raw numbers', '', f'`docs/{FIGS}/measurements.json` holds every measurement of every run the report '
              'reads, with its train.py settings (`train_args`, from the run\'s `args.yaml`), and under '
              '`earlier_runs` the runs of withdrawn arms recovered from this repository\'s history; '
              '[the list above](#every-run-trained-for-this-report) says where every other run\'s numbers are.', '']
    return '\n'.join(lines) + '\n'


def write_report(runs: Path, arms: Sequence[Arm], seeds: Sequence[int], docs: Path, command: str, wall_s: float,
                 trained: int = 0, load: Optional[Tuple[float, float]] = None, archive: Optional[Archive] = None,
                 extended: bool = False, earlier: Optional[Results] = None, revision: str = PLANS[-1].name,
                 earlier_records: Optional[Dict[str, Any]] = None) -> Path:
    """docs/reproduction.md, its plots and measurements.json from the cached runs in ``runs`` (and the runs of
    ``archive`` that the cache does not hold); ``extended`` adds revision 3's claims at more seeds and revision 4's
    pair at 120 epochs; ``earlier`` (runs of withdrawn arms, an earlier measurements.json's ``earlier_runs``) is kept
    in measurements.json and listed, read by no claim; ``revision`` is the plan's revision the report is as of (the
    study's runs up to it), which measurements.json records; ``earlier_records`` the failed and stopped runs an
    earlier measurements.json kept (``failed_runs``, ``stopped_runs``)."""
    r_final = load_results(runs, arms, seeds, archive)
    # every run at its first schedule first (revision 2.4's runs at twice the schedule read seeds again after one of
    # them had missed the rule: its reading stands beside, issue 57)
    r = first_schedules(r_final)
    claims = read_revision(PLAN_BY_NAME['2'], r)
    first = {c.claim.key: c for c in claims}
    again_24 = [c for c in read_revision(PLAN_BY_NAME['2'], r_final)
                if c.claim.key in first and c.diff.diffs != first[c.claim.key].diff.diffs]
    seeds_of = {a.name: (*seeds, *extended_seeds(a.name)) for a in arms if extended and extended_seeds(a.name)}
    r_ext = load_results(runs, [a for a in arms if a.name in seeds_of], seeds, archive, seeds_of) if seeds_of else {}
    # revision 4: revision 3's claims as registered (every run at its first schedule, those that miss the rule
    # named); revision 3.1's reading, where it trained seeds again, beside them as a sensitivity reading
    ext = read_revision(PLAN_BY_NAME['3'], first_schedules(r_ext)) if seeds_of else []
    new = [m for ms in r_ext.values() for m in ms if m['seed'] not in seeds]
    sensitivity = read_revision(PLAN_BY_NAME['3'], r_ext) if any('replaced' in m for m in new) else []
    r_long = _long_results(runs, archive) if extended else {}
    long = read_revision(PLAN_BY_NAME['4'], r_long)
    reused = {x['run'] for x in longer_runs(new)}  # revision 3.1's runs that revision 4 reads again
    seen = {m['seed'] for ms in r_long.values() for m in ms if m.get('run') in reused}
    long_unseen = read(r_long, [LONG_CLAIM], without=seen) if seen else []  # issue 57: the runs no one had seen
    figs = (draw_plots(r, claims, docs / FIGS, {a.name: a.label for a in arms})
            + draw_extended(claims, ext, docs / FIGS, sensitivity, long))
    power = powers(claims) if ext else {}
    rev5 = PLAN_BY_NAME['5']
    later = {rev.name for rev in PLANS[:[p.name for p in PLANS].index(revision) + 1]}
    r5, failed5, decisions5, read5, section5 = {}, {}, [], {}, []
    stopped = unique_stops([*(earlier_records or {}).get(STOPPED_KEY, []), *stopped_runs(runs)])
    if extended and r_long and '5' in later:  # revision 5: the SAM family against revision 4's pair
        failed_archived = (earlier_records or {}).get(FAILED_KEY, {})
        pair = {n: r_long[n] for n in (R5_ADAMW, R5_SAM)}
        r5, failed5, decisions5, read5 = load_revision(rev5, runs, archive, pair, failed_archived)
    if decisions5:
        cost_file = docs / FIGS / 'step_cost.json'
        record = next((x for x in REVISIONS if x.name == '5'), None)
        labels = {**{a.name: a.label for a in (*LONG_ARMS, *R5_ARMS)}, R5_ADAMW: 'ViT + AdamW', R5_SAM: 'ViT + SAM'}
        section5 = cost_gain_section(rev5, r5, r_long[R5_ADAMW], r_long[R5_SAM], labels, decisions5, read5,
                                     json.loads(cost_file.read_text()) if cost_file.is_file() else None, failed5,
                                     stopped, (*label(record), record.note) if record else (
                                         'not established', 'not yet in the record of registration.py'),
                                     docs / FIGS, FIGS)
        reuse = docs / FIGS / 'looksam_reuse.json'  # reproduction/looksam_reuse.py's finding, where it was run
        if reuse.is_file():
            section5 += reuse_paragraph(json.loads(reuse.read_text()))
    every = {**r_final, **r_ext, **r_long, **r5}
    (docs / FIGS / 'measurements.json').write_text(json.dumps(dict(
        revision=revision, seeds=list(seeds), arms={a.name: dict(model=a.model, model_kwargs=a.model_kwargs, opt=a.opt,
                                              opt_kwargs=a.opt_kwargs, lr=a.lr, fraction=a.fraction,
                                              epochs=a.epochs, seeds=list(seeds_of.get(a.name, seeds)))
                                 for a in (*arms, *(LONG_ARMS if r_long else ()))},
        **({'revision_5': dict(decisions=[asdict(d) for d in decisions5],
                               claims={k: dict(_claim_json(c), margin=c.claim.margin, direction=c.claim.direction)
                                       for k, c in read5.items()},
                               arms={a.name: dict(opt=a.opt, opt_kwargs=a.opt_kwargs, lr=a.lr,
                                                  weight_decay=a.weight_decay, epochs=a.epochs,
                                                  seeds=[m['seed'] for m in r5.get(a.name, [])])
                                     for a in (R5_CHECK[0], *R5_ARMS)})} if decisions5 else {}),
        **({FAILED_KEY: failed5} if failed5 else {}), **({STOPPED_KEY: stopped} if stopped else {}),
        claims={c.claim.key: dict(_claim_json(c), margin=c.claim.margin, direction=c.claim.direction)
                for c in claims},
        sensitivity_claims_revision_2_4={c.claim.key: _claim_json(c) for c in again_24},
        extended_claims={c.claim.key: _claim_json(c) for c in ext},
        extended_claims_revision_3_1={c.claim.key: _claim_json(c) for c in sensitivity},
        revision_4_claims={c.claim.key: _claim_json(c) for c in long},
        revision_4_claims_unseen_seeds={c.claim.key: _claim_json(c) for c in long_unseen},
        revisions={rev.name: dict(commit=rev.commit, committed=rev.committed, first_run=rev.first_run,
                                  label=label(rev)[0], why=label(rev)[1]) for rev in REVISIONS},
        power={k: dict(seeds=p.n, mean=p.mean, sd=p.sd, settle_now=p.settle_now, settle=p.settle,
                       exclude_zero=p.exclude_zero) for k, p in power.items()},
        runs=machine_neutral(every), **({EARLIER: machine_neutral(earlier)} if earlier else {}))))
    path = docs / 'reproduction.md'
    path.write_text(report_text(r, arms, seeds, claims, figs, command, wall_s, trained, load,
                                why=why_paragraphs(r, {c.claim.key: c for c in claims}), extended=ext,
                                r_ext=r_ext, archived=bool(archive), sensitivity=sensitivity,
                                long=long[0] if long else None, r_long=r_long, r_final=r_final, again_24=again_24,
                                long_unseen=long_unseen[0] if long_unseen else None, earlier=earlier,
                                sections=section5, revisions=sorted(later, key=[p.name for p in PLANS].index),
                                r5=r5))
    return path


def _long_results(runs: Path, archive: Optional[Archive]) -> Results:
    """Revision 4's pair at 120 epochs, from the cache or read back (revision 3.1's reused runs included); nothing
    where none of its runs exists yet, an error naming the first one missing where some do."""
    keys = [(a.name, seed) for a in LONG_ARMS for seed in LONG_SEEDS]
    own = [k for k in keys if k[1] not in LONG_REUSED]  # revision 3.1 trained the others, whatever revision 4 does
    if not any(k in (archive or {}) or in_cache(runs, *k) for k in own):
        return {}  # a study from before revision 4, or one that has not trained its pair yet
    held = {**(archive or {}), **long_archive(archive or {})}
    missing = [k for k in keys if k not in held and not in_cache(runs, *k)]
    if missing:
        raise ValueError(f'revision 4\'s run {missing[0][0]} seed {missing[0][1]} is neither in {runs} nor read back '
                         f'({len(missing)} of its {len(keys)} runs missing); train them first '
                         '(python reproduction/reproduce.py)')
    return load_results(runs, LONG_ARMS, LONG_SEEDS, held)


def machine_neutral(results: Results) -> Results:
    """The runs as measurements.json keeps them, without the folders of the machine that trained them: each run's
    ``train_args`` (its ``args.yaml``) names its output folder ``<runs>`` and its data folder ``<data>/NAME``
    (``reproduce.py --runs`` and the timm-ext cache's digits there); every other value is train.py's own."""
    def neutral(m: Dict[str, Any]) -> Dict[str, Any]:
        m = dict(m)
        if isinstance(m.get('train_args'), dict):
            args = dict(m['train_args'])
            if args.get('output'):
                args['output'] = '<runs>'
            if args.get('data_dir'):
                args['data_dir'] = f'<data>/{Path(str(args["data_dir"])).name}'
            m['train_args'] = args
        if m.get('replaced'):
            m['replaced'] = [neutral(r) for r in m['replaced']]
        return m

    return {arm: [neutral(m) for m in ms] for arm, ms in results.items()}


def _claim_json(c: ClaimResult) -> Dict[str, Any]:
    return dict(seeds=c.n, diffs=c.diff.diffs, mean=c.diff.mean, low=c.diff.low, high=c.diff.high, verdict=c.label,
                verdict_before_revision_4=c.before_revision_4, agree=c.agree)


def _revision_time(r_ext: Results, seeds: Sequence[int]) -> Optional[str]:
    """Where revision 3's and 3.1's runs spent their time (the new seeds at their first schedule, then the runs at
    twice the schedule): wall-clock from each run's recorded times, CPU time and CPU model where recorded."""
    new = [m for ms in r_ext.values() for m in ms if m['seed'] not in seeds]
    parts = []
    for name, runs in (('Revision 3', [m.get('replaced', [m])[0] for m in new]), ('Revision 3.1', longer_runs(new))):
        text = spend(runs, day=False)
        if text:
            parts.append(f'{name}: {text}; {cpu_of(runs)}')
    return '. '.join(parts) + '.' if parts else None
