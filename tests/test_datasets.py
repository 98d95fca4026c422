import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pipeline.datasets import DatasetError, ParquetSink, dataset_path, read_dataset, read_metadata


def test_datasets_read_back_without_padding_and_in_pandas(tiny_cfg, tiny_data):
    path = dataset_path(tiny_data, "lis", 4, "train")
    data = read_dataset(path)
    frame = pd.read_parquet(path)
    assert len(frame) == len(data) == tiny_cfg.generate.train_samples
    assert list(frame.columns) == ["tokens", "prompt_len", "answer", "length"]
    assert np.array_equal(frame.tokens[7], data.sequence(7)) and frame.length[7] == len(data.sequence(7)) - 1
    assert pq.ParquetFile(path).metadata.num_row_groups >= 1


def test_missing_corrupt_and_foreign_files_are_named(tmp_path, tiny_data):
    with pytest.raises(DatasetError, match="is missing"):
        read_metadata(tmp_path / "nope.parquet")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(dataset_path(tiny_data, "lis", 4, "test").read_bytes()[:300])
    with pytest.raises(DatasetError, match=f"dataset file {bad} is corrupt"):
        read_dataset(bad)
    foreign = tmp_path / "foreign.parquet"
    pd.DataFrame({"x": [1, 2]}).to_parquet(foreign)
    with pytest.raises(DatasetError, match="not written by this pipeline"):
        read_dataset(foreign)


def test_an_interrupted_write_leaves_no_file_that_looks_complete(tmp_path):
    path = tmp_path / "t.parquet"
    sink = ParquetSink(path, {"task": "x"}, row_group_size=2)
    for _ in range(5):  # two row groups already on disk, in the temporary file
        sink.add(np.array([3, 4, 1]), 1, 4)
    assert not path.exists() and sink.tmp.exists()
    sink.abort()
    assert not path.exists() and not sink.tmp.exists()
