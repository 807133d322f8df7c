"""What SAM's step says when it cannot take an update: the one-line messages, and the error with nothing to replay."""

__all__ = ['FINISH_ONLY', 'HOW_TO_USE', 'NO_MODEL', 'NoSecondPassError', 'UNKNOWN_MODEL']

HOW_TO_USE = (
    'pass a closure (optimizer.step(closure)), call first_step() and second_step() around your second '
    'forward-backward, train with timm\'s train.py (task API, timm >= 1.0.23), where SAM replays the task, '
    'call timm_ext.optim.replay_timm_task(optimizer, task) once in your own loop over a timm training task, '
    'or use timm_ext.integrations.hf_trainer.SAMTrainer in the Hugging Face Trainer')
FINISH_ONLY = ('SAM.step() after first_step() finishes the update as second_step() does: call it without a '
               'closure, and with an fp16 GradScaler call sam.second_step(grad_scaler=scaler) yourself (a wrapper '
               'hiding step\'s grad_scaler argument, e.g. Accelerate\'s, cannot hand SAM the second pass\'s scale); '
               'the weights are back at w')
NO_MODEL = 'its buffers (BatchNorm statistics) are updated by both passes'
UNKNOWN_MODEL = ('SAM does not know the model, so {purpose}: pass model= to SAM or to create_optimizer_v2 (or call '
                 'optimizer.set_model(model)) when driving SAM with first_step()/second_step() or a closure')


class NoSecondPassError(RuntimeError):
    """``step()`` has gradients but no way to evaluate the loss at w + e (no closure, no training task replayed):
    SAM refuses rather than take a plain base-optimizer step that would silently not be SAM."""
