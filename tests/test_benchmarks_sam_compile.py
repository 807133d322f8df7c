"""benchmarks/bench_sam_compile.py --quick (CI): every field is printed and says what it should; times are
not judged (a 2-core machine under load decides them). ``aot_eager``: no C++ build in CI."""
import math
import re
import sys
from pathlib import Path

import pytest
import timm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / 'benchmarks'))  # scripts beside the package
import bench_sam_compile  # noqa: E402

from timm_ext.machine import cpu_name  # noqa: E402


@pytest.mark.slow
def test_quick_run_prints_machine_model_batch_compilations_and_both_ratios(capsys):
    threads = torch.get_num_threads()
    try:
        bench_sam_compile.main(['--quick', '--backend', 'aot_eager'])
    finally:
        torch.set_num_threads(threads)  # the script sets its --threads for the process
    lines = dict(line.split(': ', 1) for line in capsys.readouterr().out.splitlines()[1:])
    assert lines['cpu'] == cpu_name() != ''
    assert lines['torch'] == f'{torch.__version__} (timm {timm.__version__}, CPU threads 1)'
    assert lines['model'].startswith('vit_tiny_patch16_224 (') and 'dropout 0.1, drop-path 0.1' in lines['model']
    assert lines['batch'] == '2' and lines['backend'] == 'aot_eager'
    # SAM's second pass (at w + e, under fork_rng) reuses the graph of its first: one graph each, no break
    assert lines['compilations'].startswith('SAM 1, AdamW 1 (') and lines['compilations'].endswith('graph breaks 0)')
    for key in ('compiled SAM/AdamW', 'eager SAM/AdamW'):
        match = re.fullmatch(r'(\d+\.\d{3}) \(SAM (\d+\.\d{3}) s, AdamW (\d+\.\d{3}) s(.*)\)', lines[key])
        assert match, lines[key]
        ratio, sam_s, adamw_s = (float(match.group(i)) for i in (1, 2, 3))
        assert math.isfinite(ratio) and ratio > 0 and sam_s > 0 and adamw_s > 0
    assert lines['compiled SAM/AdamW'].endswith(('; goal <= 2.05: met)', '; goal <= 2.05: NOT met)'))
    assert re.fullmatch(r'compiled \d+\.\d{3}, eager \d+\.\d{3} \(process CPU time.*\)', lines['CPU time SAM/AdamW'])
    assert 'before the repeats' in lines['load average 1 / 5 min']
