"""benchmarks/bench_amp_cpu.py on a tiny ViT: the machine line and one row per model with the three step times and
both ratios; times are not judged (a 2-core machine under load decides them)."""
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'benchmarks'))  # scripts beside the package
import bench_amp_cpu  # noqa: E402

from timm_ext.machine import cpu_name  # noqa: E402


def test_prints_the_cpu_and_a_row_of_fp32_bf16_fp16_with_their_ratios(capsys):
    threads = torch.get_num_threads()
    try:
        bench_amp_cpu.main(['--models', 'test_vit', '--img-size', '32', '--batch-size', '2', '--repeats', '1'])
    finally:
        torch.set_num_threads(threads)  # the script sets its --threads for the process
    head, columns, _, row = capsys.readouterr().out.splitlines()
    assert head.startswith(f'{cpu_name()}; torch {torch.__version__}') and 'samadamw, batch 2 at 32 px' in head
    assert columns == ('| model | fp32 s / step | bf16 autocast s / step | fp16 autocast s / step | bf16 / fp32 | '
                       'fp16 / fp32 |')
    match = re.fullmatch(r'\| test_vit \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+)x \| ([0-9.]+)x \|', row)
    assert match and all(float(v) > 0 for v in match.groups()), row
