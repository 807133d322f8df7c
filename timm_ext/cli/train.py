"""``timm-ext train [-c RECIPE] [train.py arguments ...]``: timm's own train.py with timm-ext loaded."""
import argparse
import os
import sys
import time
from typing import List

from timm_ext.cli._errors import CliError
from timm_ext.cli._scripts import resolve_script, run_child
from timm_ext.launch.build_command import TrainCommand, TrainConfigError, build_train_command
from timm_ext.launch.distributed import DEFAULT_PORT, DEFAULT_RDZV_BACKEND, LaunchError, resolve_launch
from timm_ext.launch.resume import resume_command, run_folder
from timm_ext_cli.commands import COMMANDS

PASSTHROUGH = True


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        'train', allow_abbrev=False,
        help=COMMANDS['train'],
        description='Run timm\'s own train.py for the installed timm version with timm-ext loaded '
                    '(--device-modules timm_ext is added when absent). Every argument not listed here goes to '
                    'train.py unchanged; `timm-ext train --train-help` shows them.',
        epilog='Before train.py starts, the recipe and the arguments are checked (unknown recipe keys, a SAM name '
               'timm\'s factory would not build, no CUDA without --device, an ImageFolder whose class count '
               'differs from --num-classes, SAM arguments left over under a baseline --opt, a SAM setting its '
               'optimizer refuses (rho -0.05), an unknown model, an input size the model cannot take (a ViT built '
               'for 224 px at --img-size 32), a missing --data-dir or split folder, fewer images per process than '
               'the batch, a paper recipe at another global batch than its paper\'s, an --initial-checkpoint whose '
               'head (class count) or architecture the model cannot take (fine-tune with --pretrained '
               '--pretrained-path FILE), a --resume checkpoint of another model or optimizer; --amp in float16 on '
               'the CPU is a warning). --grad-accum-steps auto '
               '(timm-ext replaces it with a number before train.py sees it) picks the accumulation steps that '
               'give a packaged paper recipe\'s global batch at this world size and --batch-size, so its paper\'s lr '
               'applies unchanged. '
               'Inside a SLURM job (SLURM_JOB_ID set; srun --ntasks-per-node=1, one timm-ext train per node), '
               'what is not given comes from SLURM: --nnodes (SLURM_JOB_NUM_NODES), --nproc-per-node '
               '(SLURM_GPUS_ON_NODE or SLURM_GPUS_PER_NODE), --rdzv-endpoint (the first host of SLURM_JOB_NODELIST, '
               f'port {DEFAULT_PORT}) and --rdzv-id (SLURM_JOB_ID).')
    parser.add_argument('-c', '--config', metavar='RECIPE',
                        help='a recipe: a YAML file or a packaged recipe name (`timm-ext recipes list`)')
    parser.add_argument('--timm-train', metavar='PATH',
                        help='timm\'s train.py (or its folder) to run instead of the one found for the installed timm')
    parser.add_argument('--allow-unverified', action='store_true',
                        help='run a train.py whose sha256 is not in timm-ext\'s table of timm releases')
    torchrun = parser.add_argument_group(
        'torchrun', 'passed on to python -m torch.distributed.run (torchrun) under the same names; without '
                    '--nnodes > 1 (or a --rdzv-endpoint) torchrun runs --standalone on this node')
    torchrun.add_argument('--nproc-per-node', type=int, metavar='N',
                          help='run N processes on each node through torchrun, like timm\'s distributed_train.sh')
    torchrun.add_argument('--nnodes', metavar='N|MIN:MAX',
                          help='nodes in all, or an elastic range (the checks count MAX nodes)')
    torchrun.add_argument('--node-rank', type=int, metavar='R',
                          help='this node\'s rank, 0..N-1 (checked; torchrun needs it only for --rdzv-backend '
                               'static, the default backend assigns ranks itself)')
    torchrun.add_argument('--rdzv-endpoint', metavar='HOST:PORT',
                          help='the rendezvous (a host of the job and a free port), the same on every node')
    torchrun.add_argument('--rdzv-id', metavar='ID', help='the job\'s id, the same on every node')
    torchrun.add_argument('--rdzv-backend', metavar='NAME',
                          help=f'the rendezvous backend (default {DEFAULT_RDZV_BACKEND})')
    torchrun.add_argument('--max-restarts', type=int, metavar='K',
                          help='restart the workers up to K times after a failure (train.py resumes only with '
                               '--resume)')
    parser.add_argument('--allow-batch-change', action='store_true',
                        help='run a packaged paper recipe at another global batch (batch x processes x accumulation '
                             'steps) than its paper\'s, with a one-line warning instead of an error')
    parser.add_argument('--threads', type=int, metavar='N', default=None,
                        help='CPU threads per train.py process (sets OMP_NUM_THREADS and MKL_NUM_THREADS). Default on '
                             'the CPU, unless OMP_NUM_THREADS is set: the cores free at start (the load average) '
                             'shared among the processes, at least 1 (docs/cli.md#cpu-threads); on CUDA: unset')
    parser.add_argument('--no-check', action='store_true',
                        help='skip timm-ext\'s checks of the recipe and arguments')
    parser.add_argument('--dry-run', '--print-command', action='store_true', dest='dry_run',
                        help='check, then print the command (one line, shell-quoted) instead of running it; '
                             '--print-command is the same option, e.g. to see a SLURM job\'s torchrun line on a '
                             'login node')
    parser.add_argument('--train-help', action='store_true', help='show train.py\'s own arguments')
    return parser


def run(args: argparse.Namespace, extra: List[str]) -> int:
    script = resolve_script('train.py', args.timm_train, args.allow_unverified)
    if args.train_help:
        return run_child([sys.executable, str(script.path), '--help'])
    try:
        launch = resolve_launch(args.nproc_per_node, args.nnodes, args.node_rank, args.rdzv_endpoint, args.rdzv_id,
                                args.rdzv_backend, args.max_restarts, environ=os.environ)
        command = build_train_command(
            extra, recipe=args.config, check=not args.no_check, script=script,
            allow_batch_change=args.allow_batch_change, launch=launch, threads=args.threads)
    except (TrainConfigError, LaunchError) as e:
        raise CliError(str(e)) from None
    for note in command.notes:
        print(f'timm-ext train: {note}', file=sys.stderr)
    if command.env_note:
        print(f'timm-ext: note: {command.env_note}', file=sys.stderr)
    for warning in command.warnings:
        print(f'timm-ext train: warning: {warning}', file=sys.stderr)
    started = time.time()
    try:
        return run_child(command.argv, dry_run=args.dry_run, env=command.env)
    except KeyboardInterrupt:
        print(f'timm-ext train: interrupted; {_how_to_resume(command, started)}', file=sys.stderr)
        return 130


def _how_to_resume(command: TrainCommand, started: float) -> str:
    """The exact command that continues the run in its folder, or why there is nothing to resume yet."""
    if command.args is None:
        return 'resume with --resume OUTPUT/RUN/last.pth.tar'
    folder = run_folder(command.args, started)
    if folder is None or not (folder / 'last.pth.tar').is_file():
        return ('no checkpoint was saved yet (train.py saves one at the end of each epoch): run the same command '
                'again')
    return 'resume with: ' + resume_command(sys.argv[1:], folder, bool(command.args.experiment))
