import numpy as np
import pytest

import tasks
from pipeline.generate import SPLITS, check_file, generate_task, seq_hash
from pipeline.datasets import dataset_path, read_dataset, read_metadata
from tasks.arithmetic import Parser, needs_brackets

SMALL_SIZES = {"arithmetic": [1, 3, 6], "lis": [3, 5, 12]}


def test_every_registered_task_has_small_sizes_here():
    assert set(SMALL_SIZES) == set(tasks.TASKS)


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_checker_passes_every_generated_sample(name):
    for size in SMALL_SIZES[name]:
        task = tasks.get_task(name, size)
        rng = np.random.default_rng(size)
        for split in SPLITS:
            for _ in range(300):
                s = task.sample(rng, split)
                task.check(s.tokens, s.prompt_len, s.answer)
                assert s.tokens[-1] == tasks.EOS_ID and s.tokens[s.length - 1] == s.answer


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_checker_catches_a_corrupted_chain_and_answer(name):
    task = tasks.get_task(name, SMALL_SIZES[name][-1])
    rng = np.random.default_rng(0)
    s = task.sample(rng, "test")
    numbers = [i for i in range(s.prompt_len, s.length - 1) if task.tokens[s.tokens[i]].isdigit()]
    bad = s.tokens.copy()
    i = numbers[len(numbers) // 2]
    bad[i] = task.index[str((int(task.tokens[bad[i]]) + 1) % 11)]  # a chain value off by one
    with pytest.raises(tasks.TaskError):
        task.check(bad, s.prompt_len, s.answer)
    wrong = task.index[str((int(task.tokens[s.answer]) + 1) % 11)]
    with pytest.raises(tasks.TaskError):
        task.check(s.tokens, s.prompt_len, wrong)


def test_arithmetic_follows_the_spec_layout():
    task = tasks.get_task("arithmetic", 6)
    s = task.sample(np.random.default_rng(1), "test")
    words = task.decode(s.tokens[:-1])
    steps = " ".join(words).split(" = ")
    assert len(steps) == 7 and steps[-1] == task.tokens[s.answer]
    assert Parser(steps[0].split()).parse()[1] == 6  # the test split has exactly N operators
    assert words[s.prompt_len - 1] == "="


def test_arithmetic_brackets_follow_precedence():
    assert needs_brackets("/", None, "*")
    assert needs_brackets("*", None, "+") and needs_brackets(None, "/", "-") and needs_brackets("-", ")", "+")
    assert not needs_brackets("+", "-", "*") and not needs_brackets("(", ")", "-") and not needs_brackets("-", None, "*")
    assert Parser("( 3 - 5 ) / 2 * 4".split()).parse() == ((-2 * 6 * 4) % 11, 3)  # 2^-1 = 6 mod 11


def test_lis_length_and_vocabulary():
    task = tasks.get_task("lis", 40)
    assert task.params["value_range"] == 190 and task.max_length() == 83
    s = task.sample(np.random.default_rng(0), "train")
    assert s.length == 83 and s.prompt_len == 41


@pytest.mark.parametrize("name, size, params, match", [
    ("lis", 10, {"value_range": 20}, "value_range must be >= 2n \\+ 1 = 21"),
    ("lis", 2, {}, "lis size n must be >= 3"),
    ("arithmetic", 0, {}, "must be >= 1"),
    ("arithmetic", 3, {"mixture": "over"}, "mixture must be"),
    ("nonsense", 3, {}, "unknown task 'nonsense'; registered tasks: arithmetic, lis"),
])
def test_impossible_parameters_are_rejected(name, size, params, match):
    with pytest.raises(tasks.TaskError, match=match):
        tasks.get_task(name, size, **params)


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
                assert meta["vocab"][:2] == ["<pad>", "<eos>"] and meta["seed"] == 2023
                assert meta["stats"]["max_length"] == int(data.lengths.max())
                assert check_file(tasks.get_task(task_name, size), path) == len(data)
            assert not hashes["train"] & hashes["test"]


def test_same_seed_gives_identical_files(tiny_cfg, tiny_data, tmp_path):
    generate_task(tiny_cfg, "lis", tmp_path, check=False)
    for split in SPLITS:
        size = tiny_cfg.generate.datasets["lis"][0]
        assert dataset_path(tmp_path, "lis", size, split).read_bytes() == \
            dataset_path(tiny_data, "lis", size, split).read_bytes()


def test_too_many_samples_for_the_space_fails_before_writing(tiny_cfg, tmp_path):
    cfg = tiny_cfg.model_copy(deep=True)
    cfg.generate.datasets = {"arithmetic": [1]}
    cfg.generate.test_samples = 1000  # only ~480 distinct one-operator expressions exist
    with pytest.raises(tasks.TaskError, match="space of distinct samples is too small"):
        generate_task(cfg, "arithmetic", tmp_path)
    assert not list(tmp_path.rglob("*.parquet"))
