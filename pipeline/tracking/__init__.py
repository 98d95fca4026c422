"""Where runs are recorded and shared: MLflow runs, their writer, the sweep's result tables, the services a sweep
needs, and runs shared as named DVC experiments (``experiments``)."""
