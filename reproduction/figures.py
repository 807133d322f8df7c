"""The report's plots, every seed drawn: each claim's per-seed differences, curves per layer, Hessian spectra."""
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from claims import ClaimResult
from run_results import Results

# the learning rates of the scaled-ReLU comparison: (lr, patchify arm, conv-stem arm)
STEM_LRS = (('1e-3', 'vit', 'vit_convstem'), ('1.5e-3', 'vit_lr1.5e-3', 'vit_convstem_lr1.5e-3'))


def _signed_rows(claims: List[ClaimResult], label=lambda c: c.claim.key):
    """``plot_paired_differences`` rows, each claim signed so that the paper's direction is positive."""
    rows = []
    for c in claims:
        sign = -1.0 if c.claim.direction == 'decrease' else 1.0
        lo, hi = sorted((sign * c.diff.low, sign * c.diff.high))
        rows.append((label(c), [sign * d for d in c.diff.diffs], lo, hi, c.claim.margin))
    return rows


def draw_extended(claims: List[ClaimResult], extended: List[ClaimResult], figs: Path,
                  sensitivity: Sequence[ClaimResult] = (), long: Sequence[ClaimResult] = ()) -> List[str]:
    """Revision 3's plot: each extended claim at 5 seeds, at its fixed number of seeds as registered, and below it
    revision 3.1's sensitivity reading where it trained seeds again; revision 4's claim (``long``) last."""
    from timm_ext.analysis import plots as P

    if not extended:
        return []
    figs.mkdir(parents=True, exist_ok=True)
    five = {c.claim.key: c for c in claims}
    again = {c.claim.key: c for c in sensitivity}
    rows = []
    for e in extended:
        for c, what in ((five[e.claim.key], ''), (e, ', as registered'), (again.get(e.claim.key), ', revision 3.1')):
            if c is not None:
                rows += _signed_rows([c], lambda c, what=what: f'{c.claim.key} ({c.n} seeds{what})')
    rows += _signed_rows(list(long), lambda c: f'{c.claim.key} ({c.n} seeds, revision 4)')
    P.plot_paired_differences(rows, figs / 'extended_claims.png',
                              title='Each claim at 5 seeds and at its revision-3 seeds;\nrevision 4\'s claim last',
                              xlabel='difference / margin, signed so that the paper\'s direction is positive')
    return ['extended_claims.png']


def draw_plots(r: Results, claims: List[ClaimResult], figs: Path, labels: Dict[str, str]) -> List[str]:
    """The report's PNGs (every seed drawn); returns their file names."""
    from timm_ext.analysis import plots as P

    figs.mkdir(parents=True, exist_ok=True)
    made = []

    def seeds(key: str, *arms: str, sub: Optional[Callable[[Any], List[float]]] = None) -> Dict[str, List[Any]]:
        return {labels[a]: [sub(m[key]) if sub else m[key] for m in r[a]] for a in arms if a in r}

    def save(name: str, values: Dict[str, List[Any]], title: str, ylabel: str, **kw: Any) -> None:
        if values:
            P.plot_seed_curves(values, figs / f'{name}.png', title, ylabel, every_seed=True, **kw)
            made.append(f'{name}.png')

    P.plot_paired_differences(_signed_rows(claims), figs / 'claims.png',
                              title='Each claim: per-seed difference (dots) and 95 % interval (bar)',
                              xlabel='difference / margin, signed so that the paper\'s direction is positive')
    made.append('claims.png')
    for lr, a, b in STEM_LRS:
        if a in r and b in r:
            first = lambda m: m.get('replaced', [m])[0]['top1_curve']  # noqa: E731  (every seed's first schedule)
            n = len(first(r[a][0]))
            longer = ' (each seed\'s first schedule; the longer ones are in measurements.json)' if any(
                'replaced' in m for m in r[a] + r[b]) else ''
            save(f'stem_top1_lr{lr}', {labels[x]: [first(m) for m in r[x]] for x in (a, b)},
                 f'Validation top-1 per epoch, AdamW lr {lr}, 1 warmup epoch, {n} epochs{longer}', 'top-1 (%)',
                 xlabels=list(range(1, n + 1)), xlabel='epoch')
    if 'vit' in r:
        save('stem_tokens', {labels[a]: [list(m['tokens'].values()) for m in r[a]] for a in ('vit', 'vit_convstem')
                             if a in r}, 'Token cosine similarity per layer (scaled-ReLU Fig. 1)', 'cosine similarity',
             xlabels=list(r['vit'][0]['tokens']))
        layers = list(range(1, len(r['vit'][0]['entropy']) + 1))
        cb = ('vit', 'vit_cb', 'vit_cb_all')
        save('cb_cls_entropy', seeds('cls_entropy', *cb), 'Class-token attention entropy per layer (CB Fig. 7a)',
             'entropy (nats)', xlabels=layers, xlabel='layer')
        save('cb_entropy', seeds('entropy', *cb), 'Attention entropy per layer, all queries', 'entropy (nats)',
             xlabels=layers, xlabel='layer')
        save('cb_distance', seeds('distance', *cb), 'Mean attention distance per layer (CB Fig. 7b)',
             'distance (grid side = 1)', xlabels=layers, xlabel='layer')
        act = ('vit', 'vit_sam', 'vit_quarter', 'vit_sam_quarter')
        save('sam_activity', {labels[a]: [list(m['activity'].values()) for m in r[a]] for a in act if a in r},
             'Share of active GELU neurons per block, training images (vit-sam Fig. 2)', 'share > 0',
             xlabels=[n.replace('.mlp.act', '') for n in r['vit'][0]['activity']])
    fractions = [('vit_quarter', 'vit_sam_quarter', '1/4'), ('vit_half', 'vit_sam_half', '1/2'),
                 ('vit', 'vit_sam', '1')]
    if all(a in r and b in r for a, b, _ in fractions):
        values = {'ViT + AdamW': [[r[a][i]['top1'] for a, _, _ in fractions] for i in range(len(r['vit']))],
                  'ViT + SAM': [[r[b][i]['top1'] for _, b, _ in fractions] for i in range(len(r['vit']))]}
        save('sam_top1_fraction', values, 'Top-1 against the share of training data (vit-sam Table 5)', 'top-1 (%)',
             xlabels=[f for _, _, f in fractions], xlabel='training data')
    for arm in ('resnet', 'alternet', 'vit'):
        if arm in r and 'variance' in r[arm][0]:
            names = list(r[arm][0]['variance'])
            save(f'{arm}_variance', {labels[arm]: [list(m['variance'].values()) for m in r[arm]]},
                 f'Feature-map variance, {labels[arm]} (MSA shaded; how-do-vits-work Fig. 9)', 'variance',
                 xlabels=names, kinds=[r[arm][0]['kinds'][n] for n in names], log=True)
    spectra = {labels[a]: [v for m in r[a] for batch in m['spectrum'] for v in batch]
               for a in ('resnet', 'alternet', 'vit', 'vit_quarter') if a in r and 'spectrum' in r[a][0]}
    if spectra:
        P.plot_eigenvalues(spectra, figs / 'hessian_spectrum.png',
                           title='Hessian max eigenvalue spectra, top-5 per batch of 16 (Fig. 4)')
        made.append('hessian_spectrum.png')
    warmup = {labels[a]: [v for m in r[a] for batch in m['spectrum'] for v in batch]
              for a in ('resnet_warmup', 'alternet_warmup', 'vit_warmup', 'vit_quarter_warmup') if a in r}
    if warmup:
        P.plot_eigenvalues(warmup, figs / 'hessian_spectrum_warmup.png',
                           title='Hessian max eigenvalue spectra at the end of warmup (epoch 1)')
        made.append('hessian_spectrum_warmup.png')
    return made
