"""timm_ext.demo.runs: the demo's runs and their exact train.py arguments, each run one piece away from ``full``."""
import timm

from timm_ext.demo import runs as demo

# --- the runs and their train.py arguments ---------------------------------------------------------------

def _opt(args, name):
    """The values of ``name`` in an argv: everything up to the next ``--option``."""
    i = args.index(name) + 1
    values = []
    while i < len(args) and not args[i].startswith('--'):
        values.append(args[i])
        i += 1
    return values


def test_quick_is_the_plain_vit_against_all_three_pieces():
    assert [(r.name, r.model, r.opt, r.pieces) for r in demo.demo_runs(quick=True)] == [
        ('vit', 'vit_tiny_patch16_224', 'adamw', ()),
        ('full', 'vit_tiny_cb', 'samadamw', ('conv stem', 'CB', 'SAM')),
    ]


def test_ablation_runs_have_exact_train_py_arguments(tmp_path):
    runs = {r.name: r for r in demo.demo_runs(rho=0.1)}
    assert list(runs) == ['vit', 'full', 'no_stem', 'no_cb', 'no_sam']
    shared = ['img_size=16', 'patch_size=4', 'embed_dim=128', 'depth=4', 'num_heads=4']
    expected = {  # model, --model-kwargs, opt, --opt-kwargs
        'vit': ('vit_tiny_patch16_224', shared, 'adamw', None),
        'full': ('vit_tiny_cb', shared + ['stem=conv'], 'samadamw', ['rho=0.1']),
        'no_stem': ('vit_tiny_cb', shared, 'samadamw', ['rho=0.1']),
        'no_cb': ('vit_tiny_convstem', shared, 'samadamw', ['rho=0.1']),
        'no_sam': ('vit_tiny_cb', shared + ['stem=conv'], 'adamw', None),
    }
    for name, (model, kwargs, opt, opt_kwargs) in expected.items():
        args = runs[name].train_args(tmp_path / 'data', tmp_path / 'out', 7)
        assert _opt(args, '--model') == [model] and _opt(args, '--opt') == [opt], name
        assert _opt(args, '--model-kwargs') == kwargs, name
        assert (_opt(args, '--opt-kwargs') if '--opt-kwargs' in args else None) == opt_kwargs, name
        assert _opt(args, '--experiment') == [name] and _opt(args, '--epochs') == ['7']
        assert _opt(args, '--data-dir') == [str(tmp_path / 'data')]
        assert _opt(args, '--output') == [str(tmp_path / 'out')]
        # everything else is the shared TRAIN_ARGS: the same data, schedule, batch, augmentation and seed
        assert args[args.index('--num-classes'):args.index('--num-classes') + len(demo.TRAIN_ARGS)] == \
            list(demo.TRAIN_ARGS)
    assert _opt(list(demo.TRAIN_ARGS), '--input-size') == ['3', '16', '16']
    assert _opt(list(demo.TRAIN_ARGS), '--workers') == ['0']  # no loader processes competing for the cores


def _model(run):
    return timm.create_model(run.model, num_classes=10, **dict(demo.MODEL_KWARGS, **run.model_kwargs))


def test_each_ablation_run_differs_from_full_in_its_piece_only():
    runs = {r.name: r for r in demo.demo_runs()}
    models = {name: _model(run) for name, run in runs.items()}

    def shapes(m, stem):
        return {k: v.shape for k, v in m.state_dict().items() if k.startswith('patch_embed.') == stem}

    # CB has no parameters: the conv-stem ViT with and without CB have the same state_dict
    assert shapes(models['full'], True) == shapes(models['no_cb'], True) == shapes(models['no_sam'], True)
    assert shapes(models['full'], False) == shapes(models['no_cb'], False) == shapes(models['vit'], False)
    # the patchify runs share timm's PatchEmbed; the conv stem replaces it and nothing else
    assert shapes(models['no_stem'], True) == shapes(models['vit'], True) != shapes(models['full'], True)
    assert shapes(models['no_stem'], False) == shapes(models['full'], False)
    assert type(models['full'].patch_embed).__name__ == 'ConvStemPatchEmbed'
    assert type(models['vit'].patch_embed).__name__ == type(models['no_stem'].patch_embed).__name__ == 'PatchEmbed'
    assert runs['full'].cost == runs['no_cb'].cost > runs['no_stem'].cost > runs['no_sam'].cost > runs['vit'].cost
