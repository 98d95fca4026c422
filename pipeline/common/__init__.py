"""Shared utilities every stage uses: the typed config, locks, provenance and progress."""
