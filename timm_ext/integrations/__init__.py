"""timm-ext inside other training frameworks, one module per framework.

Each module imports its framework, so none is imported here: ``import timm_ext`` never pulls one in.
``hf_trainer``: SAM in the Hugging Face Trainer (``SAMTrainer``) and a timm classifier as the Trainer expects
a model (``TimmClassifier``).
"""
