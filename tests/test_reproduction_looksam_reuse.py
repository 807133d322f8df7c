"""reproduction/looksam_reuse.py: the watch changes nothing LookSAM does; the measures are what they say."""
import math

import pytest
import torch
from _reproduction import looksam_reuse

from timm_ext.optim import LookSAM


def test_cosine_and_sign_agreement_on_known_vectors():
    a, b = [torch.tensor([1.0, -2.0, 0.0])], [torch.tensor([2.0, 1.0, 5.0])]
    assert looksam_reuse._cos(a, b) == pytest.approx(0.0)
    assert looksam_reuse._cos(a, [-a[0]]) == pytest.approx(-1.0)
    assert looksam_reuse._agree(a, b) == 0.5  # the zero entry is left out: one of the two others agrees
    assert looksam_reuse._agree(a, a) == 1.0 and math.isnan(looksam_reuse._agree([torch.zeros(2)], [torch.ones(2)]))


def _tiny(alpha, cls):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = cls(model.parameters(), torch.optim.AdamW, lr=1e-2, rho=0.05, interval=5, alpha=alpha)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    reuse = 0
    for i in range(12):
        def closure(i=i):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[i % 4 * 10:][:10]), y[i % 4 * 10:][:10])
            loss.backward()
            return loss

        if cls is looksam_reuse.WatchedLookSAM:
            opt.seen = {}
        opt.step(closure)
        reuse += bool(getattr(opt, 'seen', None))
    return [p.detach() for p in model.parameters()], reuse


@pytest.mark.timm_free
def test_the_watched_optimizer_steps_as_lookSAM_does_and_sees_only_reuse_steps():
    for alpha in (0.0, 0.7):
        plain, _ = _tiny(alpha, LookSAM)
        watched, reuse = _tiny(alpha, looksam_reuse.WatchedLookSAM)
        assert all(torch.equal(a, b) for a, b in zip(plain, watched))
        assert reuse == 12 - 3  # SAM steps 0, 5 and 10; the other 9 reuse g_v


def test_train_reports_each_epoch_and_the_reuse_steps(monkeypatch):
    x, y = torch.randn(48, 3, 16, 16), torch.arange(48) % 10
    data = torch.utils.data.TensorDataset(x, y)
    monkeypatch.setattr(looksam_reuse, '_loaders', lambda seed: (
        torch.utils.data.DataLoader(data, looksam_reuse.BATCH, shuffle=True, drop_last=True),
        torch.utils.data.DataLoader(data, 128)))
    row = looksam_reuse.train(0.7, epochs=2, seed=0)
    assert len(row['top1']) == len(row['train_loss']) == 2 and row['reuse_steps'] == 6 - 2  # steps 0 and 5 are SAM's
    assert 0.0 <= row['agree_gv'] <= 1.0 and 0.0 <= row['agree_g'] <= 1.0 and -1.0 <= row['cos_g_gv'] <= 1.0


def test_bad_settings_are_one_line(capsys):
    with pytest.raises(SystemExit):
        looksam_reuse.main(['--alphas', '0.1', '1'])
    assert "--alphas: 1 is outside [0, 1), LookSAM's range" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        looksam_reuse.main(['--epochs', '0'])
    assert '--epochs must be at least 1, got 0' in capsys.readouterr().err


def _row(alpha, last, agree_gv, agree_g):
    return dict(alpha=alpha, top1=[12.0, last], train_loss=[2.3, 1.0], reuse_steps=160, cos_gv_gv=0.1, cos_g_gv=-0.05,
                cos_step_gv=0.1, agree_gv=agree_gv, agree_g=agree_g)


def test_the_reports_paragraph_says_only_what_its_rows_show():
    saved = dict(arm='vit_looksam_x2', seed=0, epochs=2, cpu_min=2.5,
                 rows=[_row(0.0, 70.0, 0.5, 0.64), _row(0.3, 10.0, 0.66, 0.55), _row(0.7, 9.0, 0.68, 0.53)])
    lines = looksam_reuse.paragraph(saved)
    text = lines[2]
    assert lines[0] == f'### {looksam_reuse.TITLE}' and lines[4:6] == list(looksam_reuse.HEADER)
    assert lines[6] == '| 0 | 12.0, 70.0 | 1.000 | +0.100 | -0.050 | +0.100 | 0.500 | 0.640 |' and len(lines) == 10
    assert 'With alpha 0 the ViT learns (70.0 % top-1 after epoch 2); with alpha 0.3, 0.7 it stays near chance' in text
    assert 'sign of -g_v on 67% of the weights and that of -g on 54% (with alpha 0: 50% and 64%)' in text
    assert 'With no reuse (alpha 0) successive kept directions g_v, 5 steps apart, have a mean cosine of +0.10' in text
    assert 'the stall comes with the reuse, not the route, between alpha 0 and 0.3' in text
    saved['rows'] = [_row(0.7, 9.0, 0.5, 0.6)]  # no row learns, none without reuse: nothing is said of either
    text = looksam_reuse.paragraph(saved)[2]
    assert 'With alpha 0.7 it stays near chance' in text
    assert not any(x in text for x in ('learns', 'With no reuse', 'not the route'))
