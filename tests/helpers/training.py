"""Training helpers: `Curve`, a trial's (step, training loss, validation accuracy) at each validation."""

import lightning as L


class Curve(L.Callback):
    """(step, training loss, validation accuracy) at every validation."""

    def __init__(self):
        self.points = []

    def on_validation_end(self, trainer, module):
        m = trainer.callback_metrics
        self.points.append((trainer.global_step, float(m["train_loss"]), float(m["val_accuracy"])))
