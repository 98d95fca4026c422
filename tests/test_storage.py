"""Datasets through the storage path: published once, content-addressed; read in place or downloaded per node;
a node that cannot read them is named."""

import pytest

from pipeline.data.datasets import DatasetError, dataset_path, file_hash
from pipeline.data.storage import DATASETS, fetch, publish
from pipeline.scheduling.cluster import probe


@pytest.fixture
def parquet(tiny_data):
    return dataset_path(tiny_data, "lis", 3, "test")


def test_a_dataset_is_published_once_under_its_hash_and_read_in_place(parquet, tmp_path):
    location = publish(parquet, str(tmp_path))
    assert location == str(tmp_path / DATASETS / file_hash(parquet) / parquet.name)
    assert publish(parquet, str(tmp_path)) == location  # already there
    assert fetch(location).read_bytes() == parquet.read_bytes()


def test_a_uri_is_downloaded_once_per_node(parquet, tmp_path, monkeypatch):
    import tempfile

    (tmp_path / "node").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "node"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR is read once per process
    location = publish(parquet, (tmp_path / "store").as_uri())  # file:// goes the way s3:// and gs:// go
    assert location.startswith("file://")
    local = fetch(location)
    assert local.is_relative_to(tmp_path / "node") and local.read_bytes() == parquet.read_bytes()
    assert fetch(location) == local


def test_a_node_that_cannot_read_the_storage_is_named(parquet, tmp_path):
    with pytest.raises(DatasetError, match="node 10.0.0.7 cannot read dataset .*every Ray node must see "
                                           "cluster.storage_path"):
        fetch(str(tmp_path / "elsewhere" / "lis.parquet"), node="10.0.0.7")


def test_the_node_probe_names_a_package_it_cannot_import_and_data_it_cannot_read(parquet, tmp_path):
    location = publish(parquet, str(tmp_path))
    assert probe(location, ("pipeline.training.train",), (), False) == ""
    assert "cannot import the package (ModuleNotFoundError" in probe(location, ("pipeline_renamed",), (), False)
    assert "cannot read dataset" in probe(str(tmp_path / "missing.parquet"), ("pipeline.training.train",), (), False)


def test_the_node_probe_names_an_architecture_its_cpu_cannot_train_in_bf16(parquet, tmp_path, monkeypatch):
    import models

    location = publish(parquet, str(tmp_path))
    monkeypatch.setattr(models, "bf16_on_cpu", lambda arch: "lstm cannot train in bf16 on this CPU" * (arch == "lstm"))
    assert probe(location, ("pipeline.training.train",), ("standard", "mamba"), False) == ""
    assert probe(location, ("pipeline.training.train",), ("standard", "lstm"), False).endswith(
        ": lstm cannot train in bf16 on this CPU")


def test_the_node_probe_names_a_torch_that_cannot_use_the_nodes_gpus_for_trials_on_gpus(parquet, tmp_path,
                                                                                        monkeypatch):
    from pipeline.common import cuda

    location = publish(parquet, str(tmp_path))
    monkeypatch.setattr(cuda, "unusable_gpus", lambda: "its torch 2.13.0+cu130 (CUDA 13.0) cannot use the 8 GPU(s)")
    assert probe(location, ("pipeline.training.train",), (), False) == ""  # trials on CPUs: its GPUs are not asked for
    assert probe(location, ("pipeline.training.train",), (), True).endswith(
        ": its torch 2.13.0+cu130 (CUDA 13.0) cannot use the 8 GPU(s)")
    monkeypatch.setattr(cuda, "unusable_gpus", lambda: "")  # none listed (Ray sees none there), or usable
    assert probe(location, ("pipeline.training.train",), (), True) == ""
