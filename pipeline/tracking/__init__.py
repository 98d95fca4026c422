"""Where runs are recorded: MLflow runs, their writer, the sweep's result tables, the services a sweep needs."""
