"""The stages of the pipeline, one module per stage of dvc.yaml (generate, sweep, report)."""
