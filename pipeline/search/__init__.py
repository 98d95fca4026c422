"""Which cells to train: the grid's cells, the plans (grid, width frontier), the Ray Tune searcher driving them."""
