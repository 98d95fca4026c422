import random
from collections.abc import Mapping

import numpy as np
import pytest

import tasks
from tasks.arithmetic import DIV, MINUS, PLUS, TIMES, Parser, needs_brackets
from tasks.base import DISTRIBUTIONS, SPLITS
from tasks.lis import lis_dp, lis_values
from tasks.papers import PAPERS
from tasks.registry import declaration_errors, register
from tests.helpers import SMALL_SIZES


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_every_task_declares_its_paper_the_papers_lengths_and_its_test_sizes(name):
    task = tasks.TASKS[name]
    assert task.name == name and declaration_errors(task) == []
    assert task.paper in PAPERS and task.test_sizes and isinstance(task.paper_lengths, Mapping)
    for size in (*task.test_sizes, *task.paper_lengths):
        tasks.get_task(name, size)  # a size the task accepts


def test_a_task_lacking_its_declarations_is_refused_at_registration():
    class Bare(tasks.Task):  # abstract: registered, never built
        name = "bare"

    class Elsewhere(Bare):
        paper, test_sizes, paper_lengths = "neither", [3], {6: "87"}

    with pytest.raises(tasks.TaskError, match="Bare: no paper; no test_sizes"):
        register(Bare)
    with pytest.raises(tasks.TaskError, match="paper 'neither' is none of .* test_sizes .* paper_lengths"):
        register(Elsewhere)
    assert "bare" not in tasks.TASKS


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_checker_passes_every_generated_sample(name):
    for size in SMALL_SIZES[name]:
        task = tasks.get_task(name, size)
        for split in DISTRIBUTIONS:
            batch = task.sample_batch(np.random.default_rng(size), split, 500)
            assert batch.lengths.max() <= task.max_length() and (batch.prompt_len <= batch.lengths).all()
            for i in range(len(batch)):
                s = batch.sample(i)
                task.check(s.tokens, s.prompt_len, s.answer)
                assert s.tokens[-1] == tasks.EOS_ID and s.tokens[s.length - 1] == s.answer


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_every_split_is_drawn_from_its_distribution_validation_from_tests(name):
    """The files' splits reach the generator as the two distributions: validation's samples are test's."""
    task = tasks.get_task(name, SMALL_SIZES[name][-1])
    drawn = {split: task.sample_batch(np.random.default_rng(7), split, 50) for split in SPLITS}
    assert np.array_equal(drawn["val"].values, drawn["test"].values)
    assert np.array_equal(drawn["val"].offsets, drawn["test"].offsets)
    with pytest.raises(tasks.TaskError, match="split must be one of"):
        task.sample_batch(np.random.default_rng(7), "validation", 1)


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_checker_catches_every_corrupted_generated_token_and_answer(name):
    """Every token after the prompt (chain of thought, answer, label, copy) is re-derived: changing any one fails."""
    task = tasks.get_task(name, SMALL_SIZES[name][-1])
    rng = np.random.default_rng(0)
    for split in DISTRIBUTIONS:
        batch = task.sample_batch(rng, split, 3)
        for i in range(len(batch)):
            s = batch.sample(i)
            for p in range(s.prompt_len, s.length):
                bad = s.tokens.copy()
                bad[p] = 2 + (bad[p] - 2 + 1 + rng.integers(task.vocab_size - 3)) % (task.vocab_size - 2)
                with pytest.raises(tasks.TaskError):
                    task.check(bad, s.prompt_len, int(bad[-2]))
            with pytest.raises(tasks.TaskError):
                task.check(s.tokens, s.prompt_len, (s.answer - 1) % (task.vocab_size - 2) + 2)
            with pytest.raises(tasks.TaskError):
                task.check(s.tokens[:-1], s.prompt_len, s.answer)  # no <eos>


@pytest.mark.parametrize("name", sorted(tasks.TASKS))
def test_reference_generators_follow_the_spec_like_the_compiled_ones(name):
    """The plain reference generators (``Task.reference``) pass the checkers, and the compiled generators draw from
    the same distribution: mean lengths and answer frequencies agree within sampling noise."""
    size = SMALL_SIZES[name][-1]
    task = tasks.get_task(name, size)
    rnd = random.Random(0)
    for split in DISTRIBUTIONS:
        ref = [task.reference_sample(rnd, split) for _ in range(1500)]
        for s in ref:
            task.check(s.tokens, s.prompt_len, s.answer)
        fast = task.sample_batch(np.random.default_rng(1), split, 20_000)
        ref_len = np.array([s.length for s in ref])
        assert abs(ref_len.mean() - fast.lengths.mean()) <= 5 * fast.lengths.std() / np.sqrt(len(ref)) + 1e-9
        ref_answers = np.bincount([s.answer for s in ref], minlength=task.vocab_size) / len(ref)
        fast_answers = np.bincount(fast.answer, minlength=task.vocab_size) / len(fast)
        assert np.abs(ref_answers - fast_answers).max() < 5 * np.sqrt(0.25 / len(ref))


@pytest.mark.parametrize("name, size, L", [
    ("lis", 40, 83), ("lis", 110, 223), ("lis", 175, 353), ("lis", 250, 503),
    ("ed", 6, 72), ("ed", 12, 210), ("ed", 16, 342), ("ed", 20, 506),
    ("arithmetic", 6, 85), ("arithmetic", 10, 221), ("arithmetic", 13, 355), ("arithmetic", 16, 505),
])
def test_maximum_lengths_at_paper_sizes_match_the_spec(name, size, L):
    """L of the DP paper's tables. lis and ed reach their closed-form maximum in a few thousand samples. In
    arithmetic the maximum is a tail: the paper's data holds ~220k N-operator expressions (its test set and the
    N-operator share of train), so we take the maximum over as many (spread over seeds: +-3%)."""
    task = tasks.get_task(name, size)
    if name == "arithmetic":
        longest = task.sample_batch(np.random.default_rng(2023), "test", 220_000).lengths.max()
        assert abs(longest - L) <= 0.03 * L and longest <= task.max_length()
        assert size != 6 or longest == L  # the only size where the tail reaches the bound 2N(N+1) + 1
    else:
        assert task.max_length() == L
        assert task.sample_batch(np.random.default_rng(0), "train", 3000).lengths.max() == L


def test_arithmetic_follows_the_spec_layout():
    task = tasks.get_task("arithmetic", 6)
    s = task.sample(np.random.default_rng(1), "test")
    words = task.decode(s.tokens[:-1])
    steps = " ".join(words).split(" = ")
    assert len(steps) == 7 and steps[-1] == task.tokens[s.answer]
    assert Parser(steps[0].split()).parse()[1] == 6  # the test split has exactly N operators
    assert words[s.prompt_len - 1] == "="


def test_arithmetic_train_mixture_and_fill_draws():
    task = tasks.get_task("arithmetic", 4)
    rng = np.random.default_rng(0)
    ops = [task.decode(task.sample_batch(rng, "train", 1, fill=fill).sequence(0)).count("=") for fill in [False] * 4000]
    shares = np.bincount(ops, minlength=5)[1:] / len(ops)  # i operators with share i / (1 + 2 + 3 + 4)
    assert np.allclose(shares, np.arange(1, 5) / 10, atol=0.03)
    fill = task.sample_batch(rng, "train", 200, fill=True)
    assert all(task.decode(fill.sequence(i)).count("=") == 4 for i in range(len(fill)))


def test_arithmetic_brackets_follow_precedence():
    none = -1
    assert needs_brackets(DIV, none, TIMES)
    assert needs_brackets(TIMES, none, PLUS) and needs_brackets(none, DIV, MINUS) and needs_brackets(MINUS, 14, PLUS)
    assert not needs_brackets(PLUS, MINUS, TIMES) and not needs_brackets(13, 14, MINUS)
    assert not needs_brackets(MINUS, none, TIMES)
    assert Parser("( 3 - 5 ) / 2 * 4".split()).parse() == ((-2 * 6 * 4) % 11, 3)  # 2^-1 = 6 mod 11


def test_lis_checker_derivation_is_the_specs_dp():
    """The checker's O(n log n) patience sorting gives the spec's O(n^2) DP, ties and runs included."""
    rnd = random.Random(0)
    for _ in range(2000):
        n = rnd.randint(0, 40)
        x = [rnd.randint(0, rnd.choice([3, 10, 100])) for _ in range(n)]
        assert lis_values(x) == lis_dp(x)


def test_lis_length_and_vocabulary():
    task = tasks.get_task("lis", 40)
    assert task.params["value_range"] == 190 and task.max_length() == 83
    s = task.sample(np.random.default_rng(0), "train")
    assert s.length == 83 and s.prompt_len == 41


@pytest.mark.parametrize("name", ["ed", "ed_local"])
def test_edit_distance_layouts_and_locality_windows(name):
    task = tasks.get_task(name, 6)
    batch = task.sample_batch(np.random.default_rng(0), "test", 2000)
    for i in range(50):
        words = task.decode(batch.sequence(i)[:-1])
        first, second = words[:words.index("|")], words[words.index("|") + 1:words.index("<sep>")]
        a, b = len(first), len(second)
        assert a <= b and 6 in (a, b) and batch.prompt_len[i] == a + b + 2
        assert len(words) == a + b + 4 + a * (2 * b + 2 if name == "ed_local" else b + 1)
        if name == "ed_local":  # each row: its letter of A, then (letter of B, value) pairs
            row = words[a + b + 2:a + b + 2 + 2 * b + 2]
            assert row[0] == first[0] and row[1::2][:b] == second and row[-1] == ","
    window, cells = batch.features["locality_window"].max(), batch.features["cell_locality_window"].max()
    L = task.max_length()
    if name == "ed":  # every cell compares input letters: the window is almost the whole sequence
        assert window == cells and window > 0.9 * L - 10
    else:  # cells look back one row at most, but row letters still copy from the input
        assert cells == 2 * 8 + 4 and window > 0.8 * L


def test_ed_keeps_the_init_quirk_unless_asked():
    quirk, textbook = tasks.get_task("ed", 6), tasks.get_task("ed", 6, textbook_init=True)
    assert quirk.chain(["a"], ["b", "c"]) == ["3", "4", ",", "<sep>", "4"]  # dp[0][j] = j, dp[1][0] = 1
    assert textbook.chain(["a"], ["b", "c"]) == ["3", "5", ",", "<sep>", "5"]  # dp[0][j] = 2j
    assert max(int(t) for t in quirk.tokens if t.isdigit()) == 3 * 6 + 2


def test_separation_tasks_have_exact_test_lengths_and_balanced_labels():
    for name, size in [("index_lookup", 50), ("dyck", 50), ("eq_random", 50), ("eq_one", 50), ("eq_ncp", 50)]:
        task = tasks.get_task(name, size)
        test = task.sample_batch(np.random.default_rng(0), "test", 4000)
        train = task.sample_batch(np.random.default_rng(1), "train", 4000)
        extra = {"index_lookup": 2, "dyck": 1, "eq_ncp": 1}.get(name, 2)
        assert (test.lengths == size + extra).all()
        if name != "dyck":  # dyck words all have length N; the others vary in train
            assert train.lengths.min() < size / 2 < train.lengths.max()
        if task.family == "classify" and name != "index_lookup":
            share = (test.answer == task.index["<yes>"]).mean()
            assert 0.46 < share < 0.54, (name, share)
    eq = tasks.get_task("eq_random", 50)
    assert eq.params["min_length"] == 6  # N/10 = 5, rounded up to even
    train = eq.sample_batch(np.random.default_rng(0), "train", 3000)
    assert set((train.lengths - 2).tolist()) == set(range(6, 51, 2))


def equality_halves(task, batch) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """(w1, w2, label yes) of each ``w1 [sep] w2 label <eos>`` string, symbols as their values 0..alphabet-1."""
    out = []
    for i in range(len(batch)):
        seq = batch.sequence(i).astype(np.int64)
        half = (len(seq) - 3) // 2
        assert seq[half] == task.index["[sep]"]
        out.append((seq[:half] - task.index["0"], seq[half + 1:2 * half + 1] - task.index["0"],
                    seq[-2] == task.index["<yes>"]))
    return out


def test_eq_one_is_drawn_as_the_separations_paper_describes_it():
    """App. H.2: an alphabet of 1024 drawn uniformly, lengths k uniform over N/10, N/10 + 2, ..., N in train and
    exactly N in test, w2 = w1 for the positives and one position changed for the negatives (which position uniform),
    labels balanced at every length (the length says nothing of the label); and the Remark's shortcut holds on every
    string: the symbol counts of w1 and w2 differ exactly for the negatives. ``min_length = N`` (the fixed-length
    control of docs/fidelity.md) trains at length N only."""
    task = tasks.get_task("eq_one", 20)
    assert task.params == {"alphabet": 1024, "min_length": 2}
    rng = np.random.default_rng(0)
    test = equality_halves(task, task.sample_batch(rng, "test", 4000))
    symbols = np.bincount(np.concatenate([w1 for w1, _, _ in test]), minlength=1024)
    assert len(symbols) == 1024 and 10 < symbols.min() and symbols.max() < 80  # 39 expected of each
    changed = []
    for w1, w2, yes in test:
        assert len(w1) == len(w2) == 10
        differ = np.flatnonzero(w1 != w2)
        assert len(differ) == (0 if yes else 1)
        assert yes == (np.bincount(w1, minlength=1024) == np.bincount(w2, minlength=1024)).all()
        changed.extend(differ)
    assert np.allclose(np.bincount(changed, minlength=10) / len(changed), 0.1, atol=0.025)
    train = equality_halves(task, task.sample_batch(rng, "train", 6000))
    lengths = np.array([2 * len(w1) for w1, _, _ in train])
    assert np.allclose(np.bincount(lengths, minlength=21)[2::2] / len(train), 0.1, atol=0.02)  # k = 2, 4, ..., 20
    yes = np.array([label for _, _, label in train])
    for k in range(2, 21, 2):
        assert 0.4 < yes[lengths == k].mean() < 0.6, k
    fixed = tasks.get_task("eq_one", 20, min_length=20).sample_batch(rng, "train", 200)
    assert (fixed.lengths == 20 + 2).all()


def test_index_lookup_read_as_written_holds_n_symbols_and_asks_as_the_default_does():
    """The paper's words, "sample a length k ... then sample N symbols ... a position between 1 and k": with
    ``full_length`` every training string holds N symbols, the position still drawn from 1..k, so positions near N
    stay as rare as in the default reading (k symbols); the test split is the same either way; the default's
    parameters (and so its datasets) are as before."""
    n, count = 40, 20000
    full = tasks.get_task("index_lookup", n, full_length=True)
    assert tasks.get_task("index_lookup", n).params == {"symbols": 64, "min_length": 10}
    written = full.sample_batch(np.random.default_rng(0), "train", count)
    default = tasks.get_task("index_lookup", n).sample_batch(np.random.default_rng(0), "train", count)
    assert (written.prompt_len == n + 1).all() and (written.lengths == n + 2).all()  # N symbols, @p, the label
    assert default.prompt_len.min() == 10 + 1 and default.prompt_len.max() == n + 1
    asked = {name: np.array([int(full.decode([b.sample(i).tokens[b.prompt_len[i] - 1]])[0][1:]) for i in range(count)])
             for name, b in (("written", written), ("default", default))}
    for p in asked.values():  # p ~ sum over k >= max(p, 10) of 1 / (k (N - 9)): near N, about 1 in N ln(N / p)
        assert abs(p.mean() - asked["default"].mean()) < 0.5 and (p > n - 5).mean() < 0.03
    for i in range(500):
        s = written.sample(i)
        full.check(s.tokens, s.prompt_len, s.answer)
    with pytest.raises(tasks.TaskError, match="input must be 40..40 symbols"):
        s = default.sample(int(np.argmin(default.prompt_len)))
        full.check(s.tokens, s.prompt_len, s.answer)
    test = full.sample_batch(np.random.default_rng(1), "test", 100)
    assert (test.prompt_len == n + 1).all()
    with pytest.raises(tasks.TaskError, match="full_length must be true or false"):
        tasks.get_task("index_lookup", n, full_length="yes")


@pytest.mark.parametrize("name, size, params, match", [
    ("lis", 10, {"value_range": 20}, "value_range must be >= 2n \\+ 1 = 21"),
    ("lis", 2, {}, "lis size n must be >= 3"),
    ("arithmetic", 0, {}, "must be >= 1"),
    ("arithmetic", 3, {"mixture": "over"}, "mixture must be"),
    ("ed", 3, {}, "ed size n must be >= 4"),
    ("ed_local", 8, {"textbook_init": "yes"}, "textbook_init must be true or false"),
    ("eq_random", 21, {}, "eq_random size N must be even"),
    ("eq_ncp", 20, {"min_length": 3}, "min_length must be even"),
    ("dyck", 25, {}, "dyck size N must be even and >= 10"),
    ("index_lookup", 8, {}, "index_lookup size N must be >= min_length = 10"),
    ("index_lookup", 20, {"alphabet": 3}, "unknown index_lookup parameters"),
    ("nonsense", 3, {}, f"unknown task 'nonsense'; registered tasks: {', '.join(sorted(tasks.TASKS))}$"),
])
def test_impossible_parameters_are_rejected(name, size, params, match):
    with pytest.raises(tasks.TaskError, match=match):
        tasks.get_task(name, size, **params)
