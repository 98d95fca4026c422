import shutil
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import polars as pl
import pyarrow.parquet as pq
import pytest

from pipeline.data.datasets import (
    MAPPED_DIR,
    DatasetError,
    ParquetSink,
    dataset_path,
    file_hash,
    read_dataset,
    read_metadata,
)
from tasks import Packed


def test_datasets_read_back_without_padding_and_in_pandas(tiny_cfg, tiny_data):
    path = dataset_path(tiny_data, "lis", 3, "train")
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
    bad.write_bytes(dataset_path(tiny_data, "lis", 3, "test").read_bytes()[:300])
    with pytest.raises(DatasetError, match=f"dataset file {bad} is corrupt"):
        read_dataset(bad)
    foreign = tmp_path / "foreign.parquet"
    pd.DataFrame({"x": [1, 2]}).to_parquet(foreign)
    with pytest.raises(DatasetError, match="not written by this pipeline"):
        read_dataset(foreign)


def test_a_length_column_that_disagrees_with_the_tokens_is_named_with_its_rows(tmp_path, tiny_data):
    import pyarrow as pa

    good = dataset_path(tiny_data, "lis", 3, "test")
    table = pq.read_table(good)
    lengths = table.column("length").to_numpy().copy()
    lengths[5] += 1  # row 5 says one token more than it holds
    bad = tmp_path / "lis_3_test.parquet"
    changed = table.set_column(3, "length", pa.array(lengths, pa.int32()))
    pq.write_table(changed.replace_schema_metadata(pq.read_metadata(good).metadata), bad)
    with pytest.raises(DatasetError, match=f"dataset file {bad}: the length column disagrees with the tokens in rows"):
        read_dataset(bad)


def test_an_interrupted_write_leaves_no_file_that_looks_complete(tmp_path):
    path = tmp_path / "t.parquet"
    sink = ParquetSink(path, {"task": "x"}, row_group_size=2)
    sample = Packed(np.array([3, 4, 1], np.uint16), np.array([0, 3]), np.array([1], np.int32), np.array([4], np.int32))
    for _ in range(5):  # two row groups already on disk, in the temporary file
        sink.add(sample)
    assert not path.exists() and sink.tmp.exists()
    sink.abort()
    assert not path.exists() and not sink.tmp.exists()


def test_datasets_read_in_polars_and_duckdb_with_the_documented_schema(tiny_data):
    path = dataset_path(tiny_data, "arithmetic", 2, "train")
    data = read_dataset(path)
    frame = pl.read_parquet(path)
    assert frame.schema == pl.Schema({"tokens": pl.List(pl.UInt16), "prompt_len": pl.Int32, "answer": pl.Int32,
                                      "length": pl.Int32})
    assert frame["tokens"][5].to_list() == data.sequence(5).tolist()
    # the answer is the token just before <eos>, the length excludes <eos>: checked over every row, in SQL
    bad = duckdb.sql(f"SELECT count(*) FROM '{path}' WHERE tokens[len(tokens) - 1] != answer "
                     f"OR len(tokens) - 1 != length OR tokens[len(tokens)] != 1").fetchall()[0][0]
    assert bad == 0 and duckdb.sql(f"SELECT max(length) FROM '{path}'").fetchall()[0][0] == data.lengths.max()


def test_datasets_are_read_through_a_shared_memory_mapped_copy_keyed_by_content(tiny_data, tmp_path):
    path = tmp_path / "lis_3_train.parquet"
    shutil.copy(dataset_path(tiny_data, "lis", 3, "train"), path)
    frame = pd.read_parquet(path)
    data = read_dataset(path)
    entry = path.parent / MAPPED_DIR / f"{path.name}.{file_hash(path)}"
    assert isinstance(data.values, np.memmap) and Path(data.values.filename) == entry / "values.npy"
    assert not data.values.flags.writeable and len(data) == len(frame)
    assert all(np.array_equal(frame.tokens[i], data.sequence(i)) for i in range(len(data)))
    assert np.array_equal(frame.prompt_len, data.prompt_len) and np.array_equal(frame.answer, data.answer)
    built = (entry / "values.npy").stat().st_mtime_ns
    assert np.array_equal(read_dataset(path, limit=5).offsets, data.offsets[:6])
    assert (entry / "values.npy").stat().st_mtime_ns == built  # the second reader maps the same copy
    shutil.copy(dataset_path(tiny_data, "lis", 3, "test"), path)  # new content: a new copy, the stale one goes
    assert len(read_dataset(path)) == len(pd.read_parquet(path)) and not entry.exists()
    assert [p.name for p in (path.parent / MAPPED_DIR).iterdir()] == [f"{path.name}.{file_hash(path)}"]


def test_a_corrupt_mapped_copy_is_named(tiny_data, tmp_path):
    path = tmp_path / "lis_3_test.parquet"
    shutil.copy(dataset_path(tiny_data, "lis", 3, "test"), path)
    read_dataset(path)
    values = next((path.parent / MAPPED_DIR).iterdir()) / "values.npy"
    values.write_bytes(values.read_bytes()[:100])
    with pytest.raises(DatasetError, match=f"the mapped copy {values.parent} of {path} is corrupt"):
        read_dataset(path)
