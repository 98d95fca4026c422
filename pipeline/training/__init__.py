"""One trial: a Lightning module over any architecture, its batches, verdict, checkpoints and data-parallel ranks."""
