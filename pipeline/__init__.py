"""The pipeline's entry points on top of the packages they use.

Stages of dvc.yaml (``python -m pipeline.<stage>``): ``generate``, ``sweep``, ``report``; and ``nightly``, which
runs the pipeline and compares the night with the last. Packages, each importing only those listed after it
(``tests.test_layout`` checks this): ``reporting`` (claims, tables, figures, nightly comparison), ``tracking``
(MLflow runs, services, the Ray cluster), ``search`` (cells, plans, the Tune searcher), ``training`` (one trial:
settings, Lightning, verdicts, checkpoints), ``data`` (Parquet datasets, their generation and storage), ``common``
(config, the cell record, locks, provenance, progress); then ``tasks`` and ``models``. docs/design.md has the map.
"""
