from timm_ext._summary_csv import read_summary


def test_rows_are_floats_per_epoch(tmp_path):
    path = tmp_path / 'summary.csv'
    path.write_text('epoch,train_loss,eval_top1\n0,2.5,10.0\n1,1.25,55.5\n')
    assert read_summary(path) == [dict(epoch=0.0, train_loss=2.5, eval_top1=10.0),
                                  dict(epoch=1.0, train_loss=1.25, eval_top1=55.5)]


def test_missing_or_half_written_file_reads_as_no_epochs(tmp_path):
    assert read_summary(tmp_path / 'absent.csv') == []
    partial = tmp_path / 'summary.csv'
    partial.write_text('epoch,train_loss\n0,2.5\n1,')  # train.py is writing the second row
    assert read_summary(partial) == []
