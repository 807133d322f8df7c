"""The 32 px digits setting of docs/sam.md's SAM-variant table (the demo's until it moved to 16 px).

``sam_variants_digits.py`` trains with it; the demo and the reproduction study have moved to 16 px.
"""

VIT = dict(img_size=32, patch_size=4, embed_dim=128, depth=4, num_heads=4)  # the demo's ViT until it moved to 16 px
# train.py settings of the first reproduction report and of docs/sam.md's SAM-variant table: the demo's TRAIN_ARGS
# of the time. The demo has since moved to 16 px digits (timm_ext.demo); this copy keeps that table reproducible.
TRAIN_ARGS = (
    '--num-classes', '10', '--input-size', '3', '32', '32', '--crop-pct', '1.0',
    '--mean', '0.5', '0.5', '0.5', '--std', '0.5', '0.5', '0.5', '--interpolation', 'bilinear',
    '--train-interpolation', 'bilinear', '--scale', '0.6', '1.0', '--ratio', '0.8', '1.25',
    '--hflip', '0', '--color-jitter', '0', '--smoothing', '0.1',
    '--batch-size', '16', '--validation-batch-size', '128', '--lr', '1e-3', '--weight-decay', '0.05',
    '--sched', 'cosine', '--sched-on-updates', '--warmup-epochs', '1', '--warmup-lr', '1e-5', '--min-lr', '0',
    '--workers', '1', '--log-interval', '1000', '--checkpoint-hist', '1', '--device', 'cpu',
)  # --seed is each run's
