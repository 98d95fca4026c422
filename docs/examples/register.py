"""The worked examples registered beside the product's tasks and architectures, as a pytest plugin, so that the
product's own tests, which iterate over the registries, run them too:

    python -m pytest -p docs.examples.register tests/test_tasks.py tests/test_models.py -k "parity or min_gru"

Imported before the tests are collected (``-p``), so the registries are complete when the tests are parametrized.
Nothing in the product imports this module or the examples."""

from __future__ import annotations

from docs.examples import min_gru, parity_task  # noqa: F401  (registration side effect)
