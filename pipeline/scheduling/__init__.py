"""The sweep's Ray side: joining and checking the cluster, the trainable a Ray worker runs, what Tune calls."""
