"""timm-ext inside other training frameworks, one module per framework.

``lightning`` and ``accelerate``: the settings SAM refuses under PyTorch Lightning and Hugging Face Accelerate,
registered with ``timm_ext.optim.framework_checks``; they import no framework (they look at it only where the
process has), so ``import timm_ext`` imports both. ``hf_trainer`` imports ``transformers``, so it is imported only
by you: SAM in the Hugging Face Trainer (``SAMTrainer``) and a timm classifier as the Trainer expects a model
(``TimmClassifier``).
"""
