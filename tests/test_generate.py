import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tasks
from pipeline import generate
from pipeline.common.config import ConfigError, load_config
from pipeline.data import validate
from pipeline.data.datasets import DatasetError, dataset_path, file_hash, read_dataset, read_metadata
from pipeline.data.parallel import Pool
from pipeline.generate import SPLITS, generate_task
from tests.helpers import ROOT, SMALL_SIZES, default_stop_signals, write_params


def seq_hash(tokens: np.ndarray) -> int:
    """64-bit digest of a whole sequence, independent of the generator's own hashes."""
    return int.from_bytes(hashlib.blake2b(tokens.astype(np.int32).tobytes(), digest_size=8).digest(), "little")


def small_config(tiny_cfg, datasets: dict, train: int = 300, test: int = 60, val: int = 40, **settings):
    cfg = tiny_cfg.model_copy(deep=True)
    cfg.tasks = sorted(tasks.TASKS)
    cfg.generate.datasets, cfg.generate.train_samples, cfg.generate.test_samples = datasets, train, test
    cfg.generate.val_samples = val
    for key, value in settings.items():
        setattr(cfg.generate, key, value)
    return cfg


@pytest.fixture(scope="module")
def small_data(tiny_cfg, tmp_path_factory):
    """Every task at its small sizes (distinct samples for the DP tasks, i.i.d. for the separations tasks, as the
    paper and separations profiles do), every sample checked by the stage."""
    out = tmp_path_factory.mktemp("small")
    for name, sizes in SMALL_SIZES.items():
        unique = tasks.TASKS[name].family == "cot"
        generate_task(small_config(tiny_cfg, {name: sizes}, unique=unique, chunk_size=128), name, out)
    return out


def test_generated_files_are_unique_disjoint_checked_and_documented(tiny_cfg, tiny_data):
    for task_name, sizes in tiny_cfg.generate.datasets.items():
        for size in sizes:
            hashes = {}
            for split in SPLITS:
                path = dataset_path(tiny_data, task_name, size, split)
                data = read_dataset(path)
                hashes[split] = {seq_hash(data.sequence(i)) for i in range(len(data))}
                assert len(hashes[split]) == len(data)  # unique within the split
                meta = read_metadata(path)
                assert meta["vocab"][:2] == ["<pad>", "<eos>"] and meta["seed"] == 2023 and meta["unique"]
                assert meta["stats"]["max_length"] == int(data.lengths.max())
                assert meta["stats"]["samples"] == sum(meta["stats"]["length_counts"].values()) == len(data)
                assert (meta["task"], meta["size"]) == (task_name, size)
                assert validate.validate_file(path) == len(data)
            assert not hashes["train"] & hashes["test"]
            assert not hashes["val"] & hashes["test"] and not hashes["val"] & hashes["train"]


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_validate_rederives_every_sample_of_every_size(small_data, name):
    for size in SMALL_SIZES[name]:
        for split in SPLITS:
            path = dataset_path(small_data, name, size, split)
            meta = read_metadata(path)
            assert meta["task"] == name and meta["family"] == tasks.TASKS[name].family
            counts = {"train": 300, "test": 60, "val": 40}
            assert validate.validate_file(path) == meta["stats"]["samples"] == counts[split]
    manifest = json.loads((small_data / name / "manifest.json").read_text())
    assert all(d["checked"] == d["samples"] for d in manifest["datasets"])


def test_validation_is_drawn_as_test_is_from_a_stream_of_its_own(small_data):
    """Validation follows the test distribution, which train does not: index lookup's k is N (train: 10 to N),
    arithmetic has N operators (train: 1 to N). Its samples are its own: not the test file's, even where samples
    repeat (index lookup is drawn i.i.d. here)."""
    from tasks.arithmetic import DIV, MINUS, PLUS, TIMES

    def spread(name: str, size: int, split: str, measure) -> set[int]:
        data = read_dataset(dataset_path(small_data, name, size, split))
        return {measure(data, i) for i in range(len(data))}

    def operators(data, i: int) -> int:
        return int(np.isin(data.sequence(i)[: data.prompt_len[i]], [PLUS, MINUS, TIMES, DIV]).sum())

    def k(data, i: int) -> int:
        return int(data.prompt_len[i]) - 1  # the symbols, then the position token

    for name, size, measure in (("index_lookup", 20, k), ("arithmetic", 6, operators)):
        assert spread(name, size, "val", measure) == spread(name, size, "test", measure) == {size}
        assert len(spread(name, size, "train", measure)) > 1
        val, test = (read_dataset(dataset_path(small_data, name, size, s)) for s in ("val", "test"))
        assert read_metadata(dataset_path(small_data, name, size, "val"))["split"] == "val"
        assert {seq_hash(val.sequence(i)) for i in range(len(val))} != \
            {seq_hash(test.sequence(i)) for i in range(len(test))}


def test_ed_files_record_the_locality_windows(small_data):
    meta = read_metadata(dataset_path(small_data, "ed_local", 8, "train"))
    assert meta["stats"]["cell_locality_window"] <= 2 * 10 + 4 < meta["stats"]["locality_window"]
    assert meta["stats"]["max_length"] <= tasks.get_task("ed_local", 8).max_length()


def test_validate_catches_a_corrupted_sample_and_wrong_stats(small_data, tmp_path):
    src = dataset_path(small_data, "lis", 12, "train")
    table, meta = pq.read_table(src), read_metadata(src)
    rows = table.column("tokens").to_pylist()
    rows[123][20] = rows[123][20] + 1  # one chain-of-thought value off by one
    bad = tmp_path / "lis_12_train.parquet"

    def write(tokens: list, meta: dict) -> None:
        fixed = table.set_column(0, "tokens", pa.array(tokens, pa.list_(pa.uint16())))
        pq.write_table(fixed.replace_schema_metadata({"capacity_atlas": json.dumps(meta)}), bad)

    write(rows, meta)
    with pytest.raises(tasks.TaskError, match=f"{bad} sample 123: lis chain of thought: token 20"):
        validate.validate_file(bad)
    assert validate.validate_file(bad, samples=50, seed=1) == 50  # a subset may miss it
    meta["stats"]["max_length"] += 1
    write(table.column("tokens").to_pylist(), meta)
    with pytest.raises(DatasetError, match="stats say"):
        validate.validate_file(bad)
    assert validate.main([str(bad)]) == 1
    assert validate.main(["--task", "lis", "--data", str(small_data), "--samples", "20"]) == 0


def test_same_seed_gives_identical_files(tiny_cfg, tiny_data, tmp_path):
    generate_task(tiny_cfg, "lis", tmp_path, check=False)
    for split in SPLITS:
        size = tiny_cfg.generate.datasets["lis"][0]
        assert dataset_path(tmp_path, "lis", size, split).read_bytes() == \
            dataset_path(tiny_data, "lis", size, split).read_bytes()


@pytest.mark.parametrize("datasets, by_dataset", [
    ({"arithmetic": [3]}, False),  # one dataset: the workers make its chunks, this process writes them
    ({"lis": [5, 6, 7]}, True),  # several of similar cost: a whole dataset per worker
])
def test_worker_count_does_not_change_a_byte(tiny_cfg, tmp_path, datasets, by_dataset):
    """Many chunks, duplicates dropped, arithmetic's fill draws: 1 process and 2 workers write the same files."""
    cfg = small_config(tiny_cfg, datasets, train=3000, test=300, chunk_size=256, row_group_size=1000)
    (name, sizes), = datasets.items()
    assert generate.by_dataset([tasks.get_task(name, size) for size in sizes], 2) == by_dataset
    manifests = [generate_task(cfg, name, tmp_path / str(workers), workers=workers) for workers in (1, 2)]
    assert manifests[0] == manifests[1]
    for size in sizes:
        for split in SPLITS:
            one, two = (dataset_path(tmp_path / w, name, size, split) for w in ("1", "2"))
            assert file_hash(one) == file_hash(two)
            assert pq.ParquetFile(one).metadata.num_row_groups == (3 if split == "train" else 1)


def test_a_failing_dataset_fails_the_task_and_leaves_no_file_nor_worker(tiny_cfg, tmp_path):
    """A whole dataset per worker: a worker's error is the task's, named, and the clean-up leaves nothing."""
    cfg = small_config(tiny_cfg, {"arithmetic": [1, 2, 3, 4]}, train=500, test=20)  # size 1: 473 distinct, 520 asked
    assert generate.by_dataset([tasks.get_task("arithmetic", n) for n in (1, 2, 3, 4)], 2)
    with pytest.raises(tasks.TaskError, match="arithmetic size 1: only [0-9]+ distinct train samples after"):
        generate_task(cfg, "arithmetic", tmp_path, workers=2)
    assert not [p for p in psutil.Process().children() if "spawn_main" in " ".join(p.cmdline())]  # workers gone
    assert not files_under(tmp_path)


def test_closing_a_pool_while_workers_send_large_results_does_not_hang():
    """Workers killed part-way through sending a result (a chunk is megabytes) must not leave the executor's thread
    waiting for the rest of the message: the interpreter's exit waits for that thread, so the stage, stopped by an
    error or Ctrl-C while making the chunks of one dataset, would hang instead of exiting."""
    pool = Pool(2)
    results = pool.imap(bytes, [(64 << 20,)] * 8)  # each worker sends 64 MB, through a 64 kB pipe buffer
    next(results)  # the other results are now on their way
    thread = pool.executor._executor_manager_thread
    pool.close(kill=True)  # as on an error or a signal
    thread.join(timeout=20)
    assert not thread.is_alive()


def test_workers_exit_at_once_and_leave_nothing_behind(tmp_path):
    """Workers skip their interpreter's teardown when the pool shuts down, yet the stage exits cleanly, with nothing
    left for the resource tracker to warn about (a worker's progress bar makes a multiprocessing lock)."""
    params = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [lis]\n"
                                                    "generate: {datasets: {lis: [5, 6, 7]}, train_samples: 300}\n")
    run = subprocess.run([sys.executable, "-m", "pipeline.generate", "--task", "lis", "--params", str(params), "--out",
                          str(tmp_path / "data"), "--workers", "2"], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    assert "resource_tracker" not in run.stderr and "Traceback" not in run.stderr
    assert dataset_path(tmp_path / "data", "lis", 7, "train").exists()


def test_too_many_samples_for_the_space_fails_before_writing(tiny_cfg, tmp_path):
    cfg = small_config(tiny_cfg, {"arithmetic": [1]}, test=1000)  # only 473 distinct one-operator expressions
    with pytest.raises(tasks.TaskError, match="space of distinct samples is too small"):
        generate_task(cfg, "arithmetic", tmp_path)
    assert not list(tmp_path.iterdir())
    params = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [arithmetic, lis]\n"
                                                    "generate: {train_samples: 1000000000000000}\n")
    with pytest.raises(ConfigError, match="generate.datasets.arithmetic: arithmetic size 2: "
                                                     "1000000000000072 distinct test \\+ val \\+ train samples "
                                                     "asked, but the space of distinct"):
        load_config(params)


def test_an_interrupted_run_leaves_no_file_that_looks_complete(tiny_cfg, tmp_path, monkeypatch):
    cfg = small_config(tiny_cfg, {"arithmetic": [1]}, train=500, test=20)  # within the bound 583, beyond the 473
    with pytest.raises(tasks.TaskError, match="only [0-9]+ distinct train samples after"):
        generate_task(cfg, "arithmetic", tmp_path)
    assert not files_under(tmp_path)  # not even the finished test file
    make_chunk = generate.make_chunk

    def interrupted(stream, index):
        if stream.split == "train" and index == 2:
            raise KeyboardInterrupt
        return make_chunk(stream, index)

    monkeypatch.setattr(generate, "make_chunk", interrupted)
    cfg = small_config(tiny_cfg, {"lis": [5, 6]}, train=1000, chunk_size=100)
    with pytest.raises(KeyboardInterrupt):
        generate_task(cfg, "lis", tmp_path)
    assert not files_under(tmp_path)


def test_the_checker_fails_the_stage_on_a_wrong_sample_as_it_is_written(tiny_cfg, tmp_path, monkeypatch):
    make_chunk = generate.make_chunk

    def wrong(stream, index):  # a generator bug in one sample of the second train chunk
        batch, hashes = make_chunk(stream, index)
        if stream.split == "train" and index == 1:
            batch.values[batch.offsets[7] + batch.prompt_len[7] + 2] += 1
        return batch, hashes

    monkeypatch.setattr(generate, "make_chunk", wrong)
    cfg = small_config(tiny_cfg, {"lis": [6]}, train=1000, chunk_size=100, row_group_size=64)  # several writes
    with pytest.raises(tasks.TaskError, match=r"lis_6_train\.parquet sample 1[0-9][0-9]: lis chain of thought"):
        generate_task(cfg, "lis", tmp_path)
    assert not files_under(tmp_path)
    cfg.generate.validate_samples = 30  # a random subset: this one misses the wrong sample
    manifest = generate_task(cfg, "lis", tmp_path)
    assert [d["checked"] for d in manifest["datasets"]] == [30, 30, 30]


def files_under(path: Path) -> list[str]:
    """Every file under ``path`` but the staging directory's (empty) lock files."""
    locks = set((path / generate.STAGING_DIR).glob("*.lock"))
    assert all(lock.stat().st_size == 0 for lock in locks)
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if not p.is_dir() and p not in locks)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_killed_generate_leaves_nothing_dvc_hashes_and_spares_live_runs(tmp_path, sig, request):
    """A real generate process with two workers, each writing a dataset of its own, stopped mid-way through a
    train file while other generates start beside it, then killed: SIGTERM and SIGINT remove its staging directory
    at once (its workers killed first); after SIGKILL (no clean-up runs) DVC does not see what is left, and the
    next run removes it."""
    # no analytics, as the project's own config says: DVC's analytics daemon would leave a file in /tmp per command
    quiet = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True, env=quiet)
    subprocess.run([sys.executable, "-m", "dvc", "config", "core.analytics", "false"], cwd=tmp_path, check=True,
                   env=quiet)
    shutil.copy(ROOT / ".dvcignore", tmp_path)  # the project's own
    (tmp_path / "dvc.yaml").write_text("stages:\n  sweep:\n    cmd: 'true'\n    deps: [data]\n")
    small = write_params(tmp_path / "small.yaml", "profile: tiny\ntasks: [arithmetic, lis]\n")
    big = write_params(tmp_path / "big.yaml", "profile: tiny\ntasks: [arithmetic, lis]\n"
                                              "generate: {train_samples: 2000000, datasets: {lis: [5, 6, 7]}}\n")
    data = tmp_path / "data"
    assert generate.main(["--task", "arithmetic", "--params", str(small), "--out", str(data)]) == 0
    if sig == signal.SIGKILL:
        # dvc.lock records data/'s hash
        assert subprocess.run([sys.executable, "-m", "dvc", "repro", "-q"], cwd=tmp_path).returncode == 0

    run = subprocess.Popen([sys.executable, "-m", "pipeline.generate", "--task", "lis", "--params", str(big), "--out",
                            str(data), "--no-check", "--workers", "2"], cwd=ROOT, stderr=subprocess.DEVNULL,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=default_stop_signals)
    request.addfinalizer(run.kill)  # a failing test leaves no run behind (its workers exit with it)
    staging = data / generate.STAGING_DIR / "lis"
    partial = staging / "lis_6_train.parquet.tmp"
    while not partial.exists():
        assert run.poll() is None
        time.sleep(0.01)
    os.kill(run.pid, signal.SIGSTOP)  # mid-way: a live run, for as long as the checks below take
    workers = psutil.Process(run.pid).children()
    assert partial.exists() and len(workers) >= 2
    with pytest.raises(DatasetError, match=f"another generate of task lis is writing {staging}"):
        generate_task(load_config(big), "lis", data)
    generate_task(load_config(small), "arithmetic", data)  # another task meanwhile: fine, and spares lis
    assert partial.exists() and (data / "arithmetic" / "manifest.json").exists()

    os.kill(run.pid, sig)
    os.kill(run.pid, signal.SIGCONT)
    assert run.wait(timeout=30) == (-sig if sig == signal.SIGKILL else 128 + sig)
    assert not psutil.wait_procs(workers, timeout=10)[1]  # the workers exit with their parent, however it died
    if sig == signal.SIGKILL:
        assert partial.exists()  # left behind, but DVC ignores it: data/ hashes as before
        status = subprocess.run([sys.executable, "-m", "dvc", "status"], cwd=tmp_path, capture_output=True, text=True)
        assert "up to date" in status.stdout, status.stdout + status.stderr
    left = [str(p.relative_to(data)) for p in staging.iterdir()] if sig == signal.SIGKILL else []
    assert files_under(data) == sorted(left + ["arithmetic/arithmetic_2_test.parquet",
                                               "arithmetic/arithmetic_2_train.parquet",
                                               "arithmetic/arithmetic_2_val.parquet", "arithmetic/manifest.json"])

    assert generate.main(["--task", "lis", "--params", str(small), "--out", str(data), "--no-check"]) == 0
    assert not staging.exists() and (data / "lis" / "manifest.json").exists()


def test_the_generate_does_not_import_torch(tmp_path):
    """torch costs seconds and ~0.3 GB to import: the generate stage checks everything but the architectures."""
    params = write_params(tmp_path / "params.yaml", "profile: tiny\ntasks: [arithmetic, lis]\n")
    argv = ["generate", "--task", "lis", "--params", str(params), "--out", str(tmp_path), "--no-check"]
    code = (f"import runpy, sys\nsys.argv = {argv!r}\n"
            "try:\n    runpy.run_module('pipeline.generate', run_name='__main__')\nexcept SystemExit as e:\n"
            "    assert e.code == 0, e.code\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'models', 'lightning')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout
    assert out.splitlines()[-1] == "[]" and dataset_path(tmp_path, "lis", 3, "train").exists()


@pytest.mark.parametrize("workers", ["0", "1000"])
def test_a_workers_flag_out_of_range_is_named_before_anything_is_generated(workers, tmp_path):
    done = subprocess.run([sys.executable, "-m", "pipeline.generate", "--task", "lis", "--out", str(tmp_path / "data"),
                           "--workers", workers], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"--workers {workers}: allowed 1 to 64" in done.stderr
    assert not (tmp_path / "data").exists()
