"""The nightly rerun (``python -m pipeline.nightly``): ``rerun`` runs the pipeline as a named DVC experiment, keeps
the night and sends its summary; ``comparison`` sets it against the night before; ``history`` draws every night of a
profile; ``notify`` posts a summary to a chat webhook (the standard library only: ``ops/nightly`` runs it with any
Python). The nights are shared through a git and a DVC remote by ``pipeline.tracking.experiments``."""
