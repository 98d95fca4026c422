"""docs/contributing.md's worked examples (docs/examples/): the example task, architecture, claim and profile run as
the product's own tests run the real ones, and every code block of the page that names a file equals that file.

The examples are registered only for the length of a test (``registered`` restores the registries) or in a pytest
of their own (``-p docs.examples.register``); nothing in the product imports them."""

from __future__ import annotations

import ast
import importlib
import random
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

import models
import tasks
from docs.examples.claim import DYCK_TWO_LAYERS
from pipeline.common import config
from pipeline.reporting.claims import CLAIMS, evaluate
from pipeline.search.cells import check_architectures, defined_cells
from tasks.registry import declaration_errors
from tests.helpers import ROOT, write_params
from tests.helpers.tables import rows

PAGE = ROOT / "docs" / "contributing.md"
EXAMPLES = ROOT / "docs" / "examples"
PLUGIN = "docs.examples.register"  # registers the example task and architecture beside the product's
# the product's tests that iterate over the registries, run on the examples alone (docs/contributing.md shows it)
PRODUCT_TESTS = ["tests/test_tasks.py", "tests/test_generate.py", "tests/test_models.py", "tests/test_precision.py",
                 "tests/test_train.py"]
SELECT = "parity or min_gru"


@pytest.fixture
def registered():
    """The example task and architecture registered (their modules run again, so their @register runs again), and
    the registries as they were afterwards: nothing of the examples outlives the test."""
    saved = [(registry, dict(registry)) for registry in (tasks.TASKS, models.ARCHITECTURES)]
    for name in ("docs.examples.parity_task", "docs.examples.min_gru", PLUGIN):
        module = sys.modules.get(name)
        importlib.reload(module) if module else importlib.import_module(name)
    try:
        yield
    finally:
        for registry, before in saved:
            registry.clear()
            registry.update(before)


def test_the_product_neither_registers_nor_imports_the_examples():
    assert "parity" not in tasks.TASKS and "min_gru" not in models.ARCHITECTURES
    assert DYCK_TWO_LAYERS.id not in {c.id for c in CLAIMS} and "dyck2" not in config.profiles()
    assert "parity" not in yaml.safe_load((ROOT / "params.yaml").read_text())["tasks"]
    importers = []
    for top in ("pipeline", "tasks", "models", "benchmarks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                importers += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "docs"]
    assert not importers


def test_the_example_task_follows_its_spec_and_its_checker_rejects_what_breaks_it(registered):
    task = tasks.get_task("parity", 8)
    assert declaration_errors(type(task)) == [] and task.tokens == ["<pad>", "<eos>", "0", "1", "even", "odd"]
    s = task.sample(np.random.default_rng(0), "test")
    words = task.decode(s.tokens[:-1])
    assert s.prompt_len == 8 and words[-1] == ("odd" if words[:8].count("1") % 2 else "even")
    task.check(task.encode(["1", "0", "1", "1", "0", "0", "0", "0", "odd"]), 8, task.index["odd"])
    for bad, match in [(["1", "0", "1", "1", "0", "0", "0", "0", "even"], "label must be 'odd'"),
                       (["1", "0", "odd", "1", "0", "0", "0", "0", "odd"], "must be bits"),
                       (["1", "0", "1", "1", "0", "0", "0", "0", "0", "odd"], "must be 1..8 bits")]:
        with pytest.raises(tasks.TaskError, match=match):
            task.check(task.encode(bad), len(bad) - 1, task.index[bad[-1]])
    train = task.sample_batch(np.random.default_rng(1), "train", 4000)
    assert set(train.lengths.tolist()) == set(range(2, 10))  # 1..8 bits and the label
    assert 0.46 < (train.answer == task.index["odd"]).mean() < 0.54  # balanced, as the space says
    assert task.space("test") == 2**8 and task.space("train") == 2**9 - 2
    for split in ("train", "test"):  # the reference generator: its samples pass the checker
        rnd = random.Random(0)
        for r in (task.reference_sample(rnd, split) for _ in range(200)):
            task.check(r.tokens, r.prompt_len, r.answer)
    with pytest.raises(tasks.TaskError, match="parity size N must be >= min_length = 3, got N = 2"):
        tasks.get_task("parity", 2, min_length=3)


def test_the_example_architecture_builds_by_name_and_decodes_as_it_trains(registered):
    torch.manual_seed(0)
    shape = dict(vocab_size=23, width=32, depth=2, heads=4, max_len=48, dropout=0.0)
    model = models.build_model("min_gru", **shape, expand=2).eval()
    x = torch.randint(0, 23, (3, 40))
    cache = model.new_cache(3)
    steps = [model(x[:, :9], cache)] + [model(x[:, t:t + 1], cache) for t in range(9, 40)]  # prefill, then 1 token
    torch.testing.assert_close(torch.cat(steps, 1), model(x), rtol=1e-5, atol=1e-5)
    hidden = 2 * 32
    linear = 2 * 40 * sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert model.exact_flops(40) == linear + 2 * 2 * 40 * 2 * hidden > linear  # depth x the recurrence's own FLOPs
    assert model.state_size(400) == model.state_size(40) == 2 * hidden * 4  # h per layer, whatever the length
    assert models.build_model("min_gru", **shape).blocks[0].mixer.hidden == 32  # expand's default, 1
    with pytest.raises(models.ArchitectureError, match="options.expand: 0 is not allowed for 'min_gru'"):
        models.build_model("min_gru", **shape, expand=0)


def check(table_rows: list[dict]) -> dict:
    (result,) = evaluate(pd.DataFrame(table_rows), [DYCK_TWO_LAYERS])
    return result.row()


def near_perfect_rows(solved_from: dict, depth: int = 2) -> list[dict]:
    """A 2-layer transformer at widths 32 and 64, solved from the given widths, at 99.5% where solved (held on
    validation and on test)."""
    table = rows("dyck", "transformer", depth, solved_from, widths=(32, 64))
    near = {"final_accuracy": 0.995, "sustained_accuracy": 0.995}
    return [r | near if r["status"] == "solved" else r for r in table]


def test_the_example_claim_holds_fails_and_is_undecided_on_synthetic_tables():
    solved = check(near_perfect_rows({20: 32, 50: 64}))
    assert solved["status"] == "holds in part" and solved["id"] == "sep_dyck_two_layers"
    assert solved["detail"].startswith("for (2): 2-layer transformer D=64 N=20, 2-layer transformer D=64 N=50: 99.5%")
    assert solved["coverage"] == ("dyck N = 20, 50 held; 100, 200, 400 not run (of 20, 50, 100, 200, 400); 1 of 1 "
                                  "models decided (2-layer transformer D=64)")
    # its own converged miss at N = 50 refutes it, whether or not another model learned N = 50
    failed = check(near_perfect_rows({20: 32, 50: None}))
    assert failed["status"] == "fails"
    assert "2-layer transformer D=64 N=50: 30.0%, converged below 99%" in failed["detail"]
    one_layer = check(near_perfect_rows({20: 32}, depth=1))
    assert one_layer["status"] == "not tested"
    assert "2-layer transformer D=64: not run on dyck at N = 20, 50" in one_layer["detail"]
    pending = check(rows("dyck", "transformer", 2, {20: None}, widths=(64,), undecided={(20, 64)}))
    assert pending["status"] == "undecided"
    assert "dyck n=20 transformer d2: seed 0 D=64 undecided (budget: " in pending["detail"]


def test_the_example_profile_loads_and_its_grid_is_the_pages(tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    conf.mkdir()
    shutil.copy(EXAMPLES / "profile.yaml", conf / "dyck2.yaml")  # as conf/dyck2.yaml would be
    monkeypatch.setattr(config, "CONF_DIR", conf)
    tasks_line = "tasks: [" + ", ".join(yaml.safe_load((ROOT / "params.yaml").read_text())["tasks"]) + "]\n"
    cfg = config.load_config(write_params(tmp_path / "params.yaml", "profile: dyck2\n" + tasks_line))
    check_architectures(cfg)  # what the sweep stage checks before Ray starts
    assert cfg.profile == "dyck2" and config.profiles() == ["dyck2"]
    assert cfg.sweep_datasets() == [("dyck", 20), ("dyck", 50)] and not cfg.generate.unique
    grid = cfg.sweep.grid
    assert (grid.architectures, grid.widths, grid.depths) == (["transformer"], [16, 32, 64], [1, 2])
    cells = defined_cells(cfg)  # the grid before any data exists, as pipeline.forecast reads it
    assert len(cells) == 12 and "its grid is 12 cells" in PAGE.read_text()
    for cell in cells.values():  # every model of the grid builds, as tests/test_config.py builds every profile's
        models.build_model(cell.arch, vocab_size=cell.vocab_size, width=cell.width, depth=cell.depth,
                           heads=cfg.sweep.model.heads, max_len=cell.max_len, **cell.arch_options)


def shown_files(page: str) -> dict[str, str]:
    """Each fenced code block whose first line is a comment naming a file: path -> the block without that line."""
    blocks = re.findall(r"^```[a-z]*\n# (\S+)\n(.*?)^```$", page, flags=re.M | re.S)
    return {path: body for path, body in blocks}


def test_every_code_block_naming_a_file_equals_that_file():
    shown = shown_files(PAGE.read_text())
    examples = {p.relative_to(ROOT).as_posix() for p in EXAMPLES.iterdir() if p.is_file() and p.stem != "register"}
    assert examples <= set(shown), "contributing.md shows every example (the plugin that registers them aside)"
    for path, body in shown.items():
        assert body == (ROOT / path).read_text(), f"contributing.md's block of {path} differs from the file"


@pytest.mark.slow
def test_the_product_tests_that_iterate_over_the_registries_pass_on_the_examples(tmp_path):
    """The product's task and model tests, run with the examples registered (a pytest of its own, so the
    registries of this one never hold them), select each example in every module and pass."""
    command = ["-m", "pytest", "-p", PLUGIN, *PRODUCT_TESTS, "-k", SELECT]
    assert f"python {' '.join(command[:-1])} \"{SELECT}\"" in PAGE.read_text()  # the page's command is this one
    junit = tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, *command, "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    cases = [(case.get("classname", "").split(".")[-1], case.get("name", ""))
             for case in ET.parse(junit).getroot().iter("testcase")]
    assert {module for module, _ in cases} == {Path(p).stem for p in PRODUCT_TESTS}  # each module ran some
    assert any("[parity" in name for _, name in cases) and any("min_gru" in name for _, name in cases)
    assert "skipped" not in done.stdout
