"""Shared utilities every stage uses: the typed config, locks, provenance, progress, and how a trial ended (status)."""
