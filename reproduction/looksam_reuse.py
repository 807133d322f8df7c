"""Why revision 5's LookSAM arm does not train: the reused direction, measured step by step.

The arm (``plan.R5_ARMS``: LookSAM k 5, alpha 0.7, rho 0.05 over AdamW lr 1e-3, weight decay 0.05, batch 16) ended at
chance in the pilot. This script trains the first epochs of that run again in a plain loop with alpha swept (0 is SAM
every 5th step; the paper's 0.7), on the study's ViT, data, augmentation and 120-epoch schedule, and measures on every
step between two SAM steps, where LookSAM adds ``alpha ||g|| / ||g_v|| g_v`` to the gradient g:

- ``cos(g_v, g_v')``: how much the kept direction changes from one SAM step to the next (the paper's premise: slowly);
- ``cos(g, g_v)``: how much the kept direction g_v (the SAM gradient's part orthogonal to the gradient at the last SAM
  step) has to do with the gradient now;
- ``cos(-dw, g_v)``: how much the update dw AdamW makes follows it (1: the step goes along the kept direction alone);
- the share of the weights whose update has the sign of -g_v, and of -g (0.5: unrelated; Adam's update is close to
  a sign per weight, so this shows what it follows where the cosine, weighted by g_v's large entries, does not).

The optimizer is :class:`timm_ext.optim.LookSAM` itself, watched by a subclass that records before it acts; the
parameter groups are timm's (no weight decay on biases and norms), as in train.py. What differs from the arm's
train.py run: this loop's data order and augmentation draws, so its curves are not the run's, only its behaviour.

    python reproduction/looksam_reuse.py [--epochs 6] [--alphas 0 0.1 0.3 0.7] [--seed 0] [--output FILE.json]
"""
import argparse
import json
import math
import random
import statistics
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from plan import BASE_LR, IMAGE_SIZE, R5_ARMS, R5_TRAINS, VIT, WEIGHT_DECAY

from timm_ext.optim import LookSAM
from timm_ext.optim.looksam import GV_KEY

__all__ = ['HEADER', 'TITLE', 'main', 'paragraph', 'row_line', 'train']

ARM = next(a for a in R5_ARMS if a.name == 'vit_looksam_x2')
BATCH, SMOOTHING, EPOCHS_120 = 16, 0.1, 120


def _cos(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    dot = sum(float((x * y).sum()) for x, y in zip(a, b))
    na = math.sqrt(sum(float((x * x).sum()) for x in a))
    nb = math.sqrt(sum(float((y * y).sum()) for y in b))
    return dot / (na * nb) if na > 0 and nb > 0 else float('nan')


def _agree(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    """The share of the entries where ``a`` and ``b`` have the same sign (zeros of either left out)."""
    same = sum(int(((x * y) > 0).sum()) for x, y in zip(a, b))
    nonzero = sum(int(((x * y) != 0).sum()) for x, y in zip(a, b))
    return same / nonzero if nonzero else float('nan')


class WatchedLookSAM(LookSAM):
    """LookSAM that keeps, on each reuse step, g and g_v as they are before it moves g."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: Dict[torch.Tensor, Any] = {}
        self.turns: List[float] = []  # cos between each kept g_v and the one before it

    def after_sam_step(self) -> None:
        before = {p: s[GV_KEY] for p, s in self.state.items() if GV_KEY in s}
        super().after_sam_step()
        both = [p for p in before if GV_KEY in self.state[p]]
        if both:
            self.turns.append(_cos([before[p] for p in both], [self.state[p][GV_KEY] for p in both]))

    def adjust_plain_gradient(self, params: List[torch.Tensor]) -> None:
        self.seen = {p: (p.grad.clone(), self.state[p][GV_KEY]) for p in params if GV_KEY in self.state.get(p, {})}
        super().adjust_plain_gradient(params)


def _loaders(seed: int) -> Any:
    from timm.data import create_transform
    from torchvision.datasets import ImageFolder

    from timm_ext.data import digits_image_folder

    root = digits_image_folder(size=IMAGE_SIZE)
    common = dict(mean=(0.5,) * 3, std=(0.5,) * 3, interpolation='bilinear', crop_pct=1.0)
    train = ImageFolder(str(root / 'train'), create_transform(
        IMAGE_SIZE, is_training=True, scale=(0.6, 1.0), ratio=(0.8, 1.25), hflip=0.0, color_jitter=0.0, **common))
    val = ImageFolder(str(root / 'validation'), create_transform(IMAGE_SIZE, **common))
    g = torch.Generator().manual_seed(seed)
    return (torch.utils.data.DataLoader(train, BATCH, shuffle=True, drop_last=True, generator=g),
            torch.utils.data.DataLoader(val, 128))


def train(alpha: float, epochs: int, seed: int) -> Dict[str, Any]:
    """The arm's first ``epochs`` epochs at ``alpha``: top-1 and train loss per epoch, the two cosines' means."""
    import timm
    from timm.optim import param_groups_weight_decay
    from timm.scheduler import CosineLRScheduler

    torch.manual_seed(seed)
    random.seed(seed)  # timm's random crop draws from Python's generator
    model = timm.create_model(ARM.model, num_classes=10, **VIT)
    train_loader, val_loader = _loaders(seed)
    opt = WatchedLookSAM(param_groups_weight_decay(model, WEIGHT_DECAY), torch.optim.AdamW, lr=BASE_LR,
                         rho=ARM.opt_kwargs['rho'], interval=ARM.opt_kwargs['interval'], alpha=alpha)
    steps = len(train_loader)
    sched = CosineLRScheduler(opt, t_initial=EPOCHS_120 * steps, warmup_t=steps, warmup_lr_init=1e-5, lr_min=0.0,
                              t_in_epochs=False)
    params = [p for p in model.parameters() if p.requires_grad]
    top1, losses, updates = [], [], 0
    seen: Dict[str, List[float]] = dict(cos_g_gv=[], cos_step_gv=[], agree_gv=[], agree_g=[])
    for _ in range(epochs):
        model.train()
        epoch_loss = []
        for x, y in train_loader:
            def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                opt.zero_grad()
                loss = F.cross_entropy(model(x), y, label_smoothing=SMOOTHING)
                loss.backward()
                return loss

            before = {p: p.detach().clone() for p in params}
            opt.seen = {}
            epoch_loss.append(float(opt.step(closure).detach()))
            if opt.seen:  # a reuse step
                g, gv = zip(*opt.seen.values())
                step = [before[p] - p.detach() for p in opt.seen]  # -dw
                for key, value in (('cos_g_gv', _cos(g, gv)), ('cos_step_gv', _cos(step, gv)),
                                   ('agree_gv', _agree(step, gv)), ('agree_g', _agree(step, g))):
                    seen[key].append(value)
            updates += 1
            sched.step_update(updates)
        model.eval()
        with torch.no_grad():
            right = sum(int((model(x).argmax(1) == y).sum()) for x, y in val_loader)
        top1.append(100.0 * right / len(val_loader.dataset))
        losses.append(statistics.fmean(epoch_loss))
    seen['cos_gv_gv'] = opt.turns
    return dict(alpha=alpha, top1=top1, train_loss=losses, reuse_steps=len(seen['cos_g_gv']),
                **{k: statistics.fmean(v) if v else math.nan for k, v in seen.items()})


HEADER = ('| alpha | top-1 by epoch (%) | train loss, last epoch | cos(g_v, g_v\') | cos(g, g_v) | cos(-dw, g_v) | '
          'sign of -dw as -g_v | sign of -dw as -g |', '|---:|---|---:|---:|---:|---:|---:|---:|')


def row_line(row: Dict[str, Any]) -> str:
    """One alpha's row of the table (``HEADER``)."""
    cells = [f'{row["alpha"]:g}', ', '.join(f'{t:.1f}' for t in row['top1']), f'{row["train_loss"][-1]:.3f}',
             *(f'{row[k]:+.3f}' for k in ('cos_gv_gv', 'cos_g_gv', 'cos_step_gv')),
             *(f'{row[k]:.3f}' for k in ('agree_gv', 'agree_g'))]
    return '| ' + ' | '.join(cells) + ' |'


TITLE = 'Why the LookSAM arm stays at chance'


def paragraph(saved: Dict[str, Any]) -> List[str]:
    """The report's subsection on what this script measured (``saved``: what ``--output`` wrote): the table, and only
    what its rows show: which alphas learn (top-1 at the last epoch at least the pilot rule's ``R5_TRAINS``), which
    stay at chance, and what the update follows where they do."""
    rows = saved['rows']
    learn = [r for r in rows if r['top1'][-1] >= R5_TRAINS]
    stall = [r for r in rows if r['top1'][-1] < R5_TRAINS]

    def alphas(rs: Sequence[Dict[str, Any]]) -> str:
        return ', '.join(f'{r["alpha"]:g}' for r in rs)

    def mean(rs: Sequence[Dict[str, Any]], key: str) -> float:
        return statistics.fmean(r[key] for r in rs)

    def last(rs: Sequence[Dict[str, Any]]) -> str:
        return ', '.join(f'{r["top1"][-1]:.1f}' for r in rs)

    text = (f'A finding beside the registered result, which it leaves as it is: `python reproduction/looksam_reuse.py '
            f'--epochs {saved["epochs"]}` trains the arm\'s first {saved["epochs"]} epochs again (of {EPOCHS_120}, '
            f'the same settings, data and schedule) in a plain loop at seed {saved["seed"]}, with alpha, the weight of '
            'the reused direction, swept (0 is SAM every 5th step), and measures every step between two SAM steps '
            f'({saved.get("cpu_min", float("nan")):.1f} CPU-min).')
    if learn:
        text += (f' With alpha {alphas(learn)} the ViT learns ({last(learn)} % '
                 f'top-1 after epoch {saved["epochs"]})')
    if stall:
        text += (f'{"; w" if learn else " W"}ith alpha {alphas(stall)} it stays near chance ({last(stall)} %), as the '
                 'arm\'s 120-epoch runs did.')
    plain = [r for r in rows if r['alpha'] == 0]
    if plain:
        text += (f' With no reuse (alpha 0) successive kept directions g_v, 5 steps apart, have a mean cosine of '
                 f'{mean(plain, "cos_gv_gv"):+.2f}, and each is nearly orthogonal to the gradients of the 4 steps '
                 f'after it ({mean(plain, "cos_g_gv"):+.2f}): at this batch of {BATCH}, g_v is not the stable '
                 'direction LookSAM\'s reuse rests on (its paper\'s observation, at large batches), and the reuse '
                 'adds it at alpha times the gradient\'s norm.')
    if stall:
        loss = ', '.join(f'{r["train_loss"][-1]:.3f}' for r in stall)
        text += (f' Where the ViT stays at chance its train loss is {loss} (ln 10 = {math.log(10):.3f}: one constant '
                 f'prediction); its kept directions then change less (mean cosine {mean(stall, "cos_gv_gv"):+.2f}), '
                 f'and AdamW\'s update has the sign of -g_v on {mean(stall, "agree_gv"):.0%} of the weights and that '
                 f'of -g on {mean(stall, "agree_g"):.0%}' + (
                     f' (with alpha {alphas(learn)}: {mean(learn, "agree_gv"):.0%} and {mean(learn, "agree_g"):.0%})'
                     if learn else '') + '.')
    if learn and stall and plain:
        text += (' The same class in the same loop trains at alpha 0 and stalls as the arm did in train.py: the stall '
                 f'comes with the reuse, not the route, between alpha {max(r["alpha"] for r in learn):g} and '
                 f'{min(r["alpha"] for r in stall):g}. One seed\'s first epochs show these symptoms; they do not '
                 'prove the cause.')
    return [f'### {TITLE}', '', text, '', *HEADER, *(row_line(r) for r in rows), '']


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='python reproduction/looksam_reuse.py', description=__doc__.splitlines()[0])
    parser.add_argument('--epochs', type=int, default=6)
    parser.add_argument('--alphas', type=float, nargs='+', default=[0.0, 0.1, 0.3, 0.7])
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--threads', type=int, default=1, help='torch threads (default 1, as the study\'s runs)')
    parser.add_argument('--output', default=None, help='also write the rows as JSON here')
    args = parser.parse_args(argv)
    bad = [a for a in args.alphas if not 0 <= a < 1]
    if bad:
        parser.error(f'--alphas: {bad[0]:g} is outside [0, 1), LookSAM\'s range')
    if args.epochs < 1:
        parser.error(f'--epochs must be at least 1, got {args.epochs}')
    torch.set_num_threads(args.threads)
    start, rows = time.process_time(), []
    print(f'{ARM.label}: rho {ARM.opt_kwargs["rho"]:g}, k {ARM.opt_kwargs["interval"]}, AdamW lr {BASE_LR:g}, '
          f'weight decay {WEIGHT_DECAY:g}, batch {BATCH}; seed {args.seed}, the first {args.epochs} of '
          f'{EPOCHS_120} epochs')
    print('\n'.join(HEADER))
    for alpha in args.alphas:
        rows.append(train(alpha, args.epochs, args.seed))
        print(row_line(rows[-1]), flush=True)
    print(f'CPU time: {(time.process_time() - start) / 60:.1f} min')
    if args.output:
        Path(args.output).write_text(json.dumps(dict(arm=ARM.name, seed=args.seed, epochs=args.epochs, rows=rows,
                                                     cpu_min=round((time.process_time() - start) / 60, 2)),
                                                indent=1))
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
