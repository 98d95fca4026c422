"""The pipeline's entry points on top of the packages they use.

Stages of dvc.yaml (``python -m pipeline.<stage>``): ``generate``, ``sweep``, ``report``. Beside them, ``nightly`` (a
package: the pipeline rerun as a named DVC experiment, compared with the night before, its summary sent, the nights
shared), ``forecast`` (what a profile costs before launch) and ``launch`` (what the cluster launchers check and do).
Packages, each importing only those listed after it (``tests.test_layout`` checks this): ``costs`` (throughput measured,
trials scheduled on slots), ``reporting`` (the papers' figures, claims, tables, figures, the page), ``scheduling`` (the
sweep's Ray side, the one package that imports Ray: the cluster, the trainable, what Tune calls, the progress line),
``tracking`` (MLflow runs, their writer, result tables, the services, runs shared as DVC experiments), ``search``
(cells, plans, the searcher), ``training`` (one trial: settings, Lightning, verdicts, checkpoints), ``data`` (Parquet
datasets, their generation and storage), ``common`` (config, the cell record, locks, provenance, progress, signals,
URLs); then ``tasks`` (with their papers' thresholds) and ``models``. docs/design.md has the map.
"""
