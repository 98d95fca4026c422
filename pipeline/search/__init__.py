"""Which cells to train: the grid's cells, the plans (grid, width frontier) and the Ray Tune searcher that drives them."""
