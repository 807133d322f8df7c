"""reproduction/run_ledger.py and recover_earlier_runs.py: every run trained for the report is listed, and every run
in measurements.json is one the list says is kept there (issue 57)."""
import json
import subprocess

import pytest
from _reproduction import REPO, recover_earlier_runs, run_ledger

ARCHIVE = REPO / 'docs' / 'reproduction' / 'measurements.json'


def test_every_run_in_measurements_json_is_listed_and_nothing_listed_as_kept_is_missing():
    saved = json.loads(ARCHIVE.read_text())
    held, listed = run_ledger.archived_runs(saved), run_ledger.kept_here()
    assert held[run_ledger.HERE] == listed[run_ledger.HERE] and len(held[run_ledger.HERE]) == 223
    assert held[run_ledger.EARLIER] == listed[run_ledger.EARLIER] and len(held[run_ledger.EARLIER]) == 10
    # each batch kept here lists as many runs as it counts; the others say where their numbers are, or what was lost
    for batch in run_ledger.TRAINED:
        if batch.where in (run_ledger.HERE, run_ledger.EARLIER):
            assert sum(len(seeds) for _, seeds in batch.arms) == batch.count, batch
        else:
            assert batch.where == 'lost' and batch.note or ':' in batch.where or 'measurements.json' in batch.where
    assert sum(b.count for b in run_ledger.TRAINED) == 483


def test_a_run_in_measurements_json_that_the_list_does_not_name_is_found():
    saved = json.loads(ARCHIVE.read_text())
    extra = dict(saved['runs']['vit'][0], run='vit-s99', seed=99)
    saved['runs']['vit'].append(extra)
    assert run_ledger.archived_runs(saved)[run_ledger.HERE] - run_ledger.kept_here()[run_ledger.HERE] == {'vit-s99'}


def test_the_section_lists_every_batch_and_reads_the_withdrawn_claim_again():
    earlier = run_ledger.load_earlier_runs(ARCHIVE)
    lines = run_ledger.ledger_section(earlier)
    assert lines[0] == '## Every run trained for this report'
    assert sum(line.startswith('| ') for line in lines) == 1 + len(run_ledger.TRAINED)
    assert ('Read again from the recovered runs, revision 2.2\'s claim (withdrawn by revision 2.3): +9.69 pt [+2.09 '
            'pt, +17.30 pt], 5/5 agree, **reproduced**; runs that miss the convergence rule: vit_lr2e-3-s3 (+4.7), '
            'vit_lr2e-3-s4 (+3.1), vit_convstem_lr2e-3-s1 (+1.1).') in lines
    assert run_ledger.load_earlier_runs(REPO / 'no-such.json') == {}


def test_recovered_runs_are_named_labelled_and_name_no_folder_of_the_machine():
    saved = {'runs': {arm: [dict(arm=arm, seed=0, top1=90.0, train_args={'output': '/home/me/runs', 'seed': 0})]
                      for arm in recover_earlier_runs.ARMS}}
    out = recover_earlier_runs.recovered(saved)
    m = out['vit_lr2e-3'][0]
    assert (m['run'], m['revision'], m['source']) == ('vit_lr2e-3-s0', '2.2', recover_earlier_runs.SOURCE)
    assert m['train_args'] == {'output': '<runs>', 'seed': 0}
    with pytest.raises(ValueError, match=r'holds no runs of vit_convstem_lr2e-3: give the measurements.json of '
                                         r'6b6c309'):
        recover_earlier_runs.recovered({'runs': {'vit_lr2e-3': []}})


def test_the_recovered_runs_are_those_the_history_printed():
    try:
        text = subprocess.run(['git', 'show', recover_earlier_runs.SOURCE], capture_output=True, text=True, check=True,
                              cwd=REPO).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f'{recover_earlier_runs.SOURCE} is not in this clone (a shallow or exported copy)')
    kept = json.loads(ARCHIVE.read_text())[run_ledger.EARLIER]
    assert kept == json.loads(json.dumps(recover_earlier_runs.recovered(json.loads(text))))
