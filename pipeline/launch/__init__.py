"""What the launchers (``ops/slurm/capacity-atlas.sbatch``, ``ops/kuberay/rayjob.yaml``) check and do around
`dvc repro` (``python -m pipeline.launch``, ``commands``): ``allocation`` asks whether an allocation's nodes hold one
trial of the profile; ``rayjob`` checks a KubeRay manifest against this checkout; ``job`` sets the profile, waits for
the Ray nodes, keeps the outputs and carries DVC's state for a checkout that lives as long as its job."""
