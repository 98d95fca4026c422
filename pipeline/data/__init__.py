"""Datasets: Parquet files written, validated, deduplicated, published to storage and read back memory-mapped."""
