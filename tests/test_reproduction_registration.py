"""reproduction/registration.py: one standard labels every revision from the facts registration.REVISIONS holds."""

import pytest
from _reproduction import plan, registration

pytestmark = pytest.mark.timm_free  # calls no timm code: the release lanes leave it out (tests/_timm_free.py)


def _rev(committed='2026-11-28 08:58:05', first_run='2026-11-28 08:58:26', seen=()):
    return registration.Revision('x', 'abc1234', committed, first_run, 'a test', 1, seen)


def test_label_reads_the_commit_the_first_run_and_what_was_seen():
    assert registration.label(_rev())[0] == 'registered'
    assert registration.label(_rev(first_run='2026-11-28 08:57:59')) == (
        'post hoc', 'its first run started at 2026-11-28 08:57:59, before the commit')
    assert registration.label(_rev(seen=('seed 2 missing the rule',))) == ('post hoc',
                                                                          'it had seen seed 2 missing the rule')
    # a run started in the commit's minute, the second not recorded: the record cannot order them
    assert registration.label(_rev(first_run='2026-11-28 08:58'))[0] == 'not established'
    assert registration.label(_rev(first_run=None))[0] == 'not established'


def test_the_study_s_revisions_get_one_label_each_by_the_same_standard():
    labels = {rev.name: registration.label(rev)[0] for rev in registration.REVISIONS}
    # 2.4 and 3.1 each read again runs they had seen miss the rule: the same label (issue 57)
    assert labels == {'2': 'not established', '2.1': 'post hoc', '2.2': 'post hoc', '2.3': 'post hoc',
                      '2.4': 'post hoc', '3': 'registered', '3.1': 'post hoc', '4': 'post hoc', '5': 'registered'}
    # revision 5 was committed 9 s before its first run; it reads revision 4's runs again by a rule written first,
    # as revision 3 read seeds 0-4, and its note says so
    rev5 = next(r for r in registration.REVISIONS if r.name == '5')
    assert rev5.committed < rev5.first_run and 'reads revision 4\'s 32 published runs again' in rev5.note
    rev4 = next(r for r in registration.REVISIONS if r.name == '4')
    assert '6 of the 32 runs it reads' in registration.label(rev4)[1] and rev4.runs == 26
    rows = registration.revisions_table()
    assert rows[0] == '| revision | commit (UTC) | first run (UTC) | runs | label | why |'
    assert len(rows) == 2 + len(registration.REVISIONS) and '| 3 | 1063a28 2026-11-28 08:58:05 |' in rows[7]


def test_plan_no_longer_ranks_seed_12_among_the_largest_gains():
    decided = plan.PLAN_BY_NAME['4'].decided
    assert 'three of the largest SAM gains' not in decided.replace('[issue 57: this said "three of the largest"]', '')
    assert '+1.7, +1.1 and +1.9 points, the 2nd, the 6th to 8th and the 1st largest of the 16' in decided
