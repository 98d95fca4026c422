"""What a trial reports when it ends, by name, for the tables and MLflow, which read it without importing the
training loop: the metrics a cell's row shows (results/sweep.csv), then those only its learning-rate runs keep
(results/trials.csv). ``pipeline.training.train.score`` returns them besides status and reason."""

CELL_METRICS = (
    "final_accuracy", "val_accuracy", "token_accuracy", "params", "paper_gflops", "exact_gflops", "train_pflops",
    "solve_step", "solve_pflops", "state_bytes", "train_steps", "budget_steps", "train_seconds", "eval_seconds",
    "eval_samples", "target", "sustained_accuracy", "converged",
)  # fmt: skip
# fused_members: the models its trial trained as one (1: a trial of its own; pipeline.training.fused_trial)
TRIAL_METRICS = ("resumed_step", "checkpoints", "checkpoint_seconds", "checkpoint_bytes", "fused_members")
