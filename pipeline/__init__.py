"""The pipeline's stages, one module per stage of dvc.yaml, on top of the packages they use.

Stages (``python -m pipeline.<stage>``): ``generate``, ``sweep``, ``report``, ``nightly``.
Packages, each importing only those listed after it (``tests/test_layout.py`` checks this):
``reporting`` (claims, tables, figures, nightly comparison), ``tracking`` (MLflow runs, services, the Ray
cluster), ``search`` (cells, plans, the Tune searcher), ``training`` (one trial: Lightning, verdicts,
checkpoints), ``data`` (Parquet datasets, their generation and storage), ``common`` (config, locks, provenance);
then ``tasks`` and ``models``.
"""
