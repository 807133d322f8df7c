"""Each arm's train step time over AdamW's, side by side in one process on the study's model, batch and data.

A revision's arms (and the AdamW and SAM arms it compares them with) each get their own copy of the study's ViT,
built with the same seed, and a train step of timm's train.py route through the task API (the route the runs
take): ``task(x, y)['loss'].backward(); optimizer.step(); optimizer.zero_grad()`` on batches of 16 of the 16 px
digits, label smoothing 0.1, each optimizer at its arm's settings. The time of a block of ``PERIOD`` steps (a
multiple of every arm's interval) is taken for each arm in turn, the block repeated (interleaved, so a change of
load hits every arm alike), and the median divided by ``PERIOD``; CPU time of the process is taken the same way.
One torch thread, as every run. MESA's term starts at step 0 here, so its steady cost is what is timed.

    python reproduction/step_cost.py [--revision 5] [--repeats 7] [--output docs/reproduction/step_cost.json]
"""
import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

PERIOD = 10  # steps per timed block: SAM every 10th step and LookSAM every 5th are charged their average step


def passes(arm: Any) -> float:
    """Forward-backward passes per step at the arm's settings, a forward without gradient counted as a third of one:
    AdamW and Momentum-SAM 1; SAM and the two-pass family 2; SAM or LookSAM every k-th step (k + 1) / k; ESAM 1 + 1/3
    (the forward at w + e that ranks the samples) + its data fraction; MESA 1 + 1/3 (the EMA copy's forward)."""
    kw = arm.opt_kwargs
    if arm.opt in ('adamw', 'msamadamw'):
        return 1.0
    if arm.opt == 'mesaadamw':
        return 1.0 + 1 / 3
    if arm.opt == 'esamadamw':
        return 1.0 + 1 / 3 + float(kw.get('data_fraction', 1.0))
    k = int(kw.get('interval', 1))
    return (k + 1) / k


def _timed(fn: Callable[[], None]) -> tuple:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(arms: Sequence[Any], repeats: int, warmup: int = 2, seed: int = 0) -> List[Dict[str, Any]]:
    """One row per arm: its passes per step, median seconds per step (wall and CPU) and both over AdamW's (the first
    arm must be AdamW)."""
    import timm
    import torch
    from measure_run import run_batches
    from plan import IMAGE_SIZE, WEIGHT_DECAY
    from timm.loss import LabelSmoothingCrossEntropy
    from timm.optim import create_optimizer_v2
    from timm.task import ClassificationTask

    import timm_ext  # noqa: F401  (registers the SAM family in timm's factory)
    from timm_ext.data import digits_image_folder
    from timm_ext.optim import SAM, replay_timm_task

    if arms[0].opt != 'adamw':
        raise ValueError(f'step_cost compares every arm with AdamW, which must come first; got {arms[0].name!r}')
    torch.set_num_threads(1)
    batches = run_batches(digits_image_folder(size=IMAGE_SIZE), 'train', PERIOD, seed)
    torch.manual_seed(seed)
    model = timm.create_model(arms[0].model, num_classes=10, **arms[0].model_kwargs)
    blocks, keep = {}, []
    for arm in arms:
        m = copy.deepcopy(model).train()
        task = ClassificationTask(m, LabelSmoothingCrossEntropy(0.1), verbose=False)
        kwargs = dict(arm.opt_kwargs, **({'start_step': 0} if arm.opt == 'mesaadamw' else {}))
        opt = create_optimizer_v2(m, arm.opt, lr=arm.lr, weight_decay=arm.weight_decay if arm.weight_decay
                                  is not None else WEIGHT_DECAY, **kwargs)
        if isinstance(opt, SAM):  # the train.py route: step() without a closure replays the task's call at w + e
            replay_timm_task(opt, task)
        keep.append((m, task, opt))  # SAM holds its task weakly

        def block(task=task, opt=opt) -> None:
            for x, y in batches:
                task(x, y)['loss'].backward()
                opt.step()
                opt.zero_grad()
        blocks[arm.name] = block
    for fn in blocks.values():
        for _ in range(warmup):
            fn()
    wall: Dict[str, List[float]] = {k: [] for k in blocks}
    cpu: Dict[str, List[float]] = {k: [] for k in blocks}
    for _ in range(repeats):
        for name, fn in blocks.items():
            w, c = _timed(fn)
            wall[name].append(w / PERIOD)
            cpu[name].append(c / PERIOD)
    base_w, base_c = statistics.median(wall[arms[0].name]), statistics.median(cpu[arms[0].name])
    return [dict(arm=a.name, passes=round(passes(a), 3), step_s=statistics.median(wall[a.name]),
                 ratio=statistics.median(wall[a.name]) / base_w, step_cpu_s=statistics.median(cpu[a.name]),
                 ratio_cpu=statistics.median(cpu[a.name]) / base_c) for a in arms]


def revision_arms(name: str) -> List[Any]:
    """AdamW and SAM at revision 4's schedule (what revision 5 compares with), then the revision's own arms."""
    from plan import PLAN_BY_NAME, R5_ADAMW, R5_SAM
    from supporting_runs import ALL_ARMS_BY_NAME

    return [ALL_ARMS_BY_NAME[n] for n in (R5_ADAMW, R5_SAM, *PLAN_BY_NAME[name].arms)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog='python reproduction/step_cost.py', description=__doc__.splitlines()[0])
    parser.add_argument('--revision', default='5', help='the revision whose arms are timed (default 5)')
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--output', default='docs/reproduction/step_cost.json')
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f'--repeats must be at least 1, got {args.repeats}')
    import os

    import timm
    import torch

    from timm_ext.machine import cpu_name

    rows = measure(revision_arms(args.revision), args.repeats)
    out = dict(revision=args.revision, period=PERIOD, repeats=args.repeats, batch=16, threads=1,
               timm=timm.__version__, torch=torch.__version__, cpu=cpu_name(), cores=os.cpu_count(),
               load=list(os.getloadavg()), when=time.strftime('%Y-%m-%d %H:%M', time.gmtime()), rows=rows)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=1) + '\n')
    for r in rows:
        print(f'{r["arm"]:<20} passes {r["passes"]:.2f}  {r["step_s"] * 1e3:6.1f} ms  x{r["ratio"]:.2f} '
              f'(CPU x{r["ratio_cpu"]:.2f})')
    return 0


if __name__ == '__main__':
    raise SystemExit(main())
