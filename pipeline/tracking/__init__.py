"""Where runs are recorded and trials run: MLflow runs, the services a sweep needs, the Ray cluster."""
