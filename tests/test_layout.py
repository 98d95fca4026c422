"""What DVC and the reuse key believe about the code, checked against the code; imports run one way, no cycles."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.common.provenance import (
    ROOT,
    TRAINING_LIBRARIES,
    code_files,
    code_hash,
    imported_names,
    library_versions,
    module_file,
)
from pipeline.search.cells import TRAINABLE, run_key

STAGES = {"generate": "pipeline.generate", "sweep": "pipeline.sweep", "report": "pipeline.report"}
# Top to bottom: a module may import its own package and those below it, never one above.
LAYERS = ["pipeline.generate pipeline.sweep pipeline.report pipeline.nightly pipeline.forecast pipeline.launch",
          "pipeline.costs", "pipeline.reporting", "pipeline.scheduling", "pipeline.tracking", "pipeline.search",
          "pipeline.training", "pipeline.data", "pipeline.common", "tasks models"]
CODE = ("pipeline", "tasks", "models")
RAYLESS = ("pipeline.training", "pipeline.tracking")  # Ray lives in pipeline.scheduling, which the sweep imports


def modules() -> dict[str, Path]:
    """Every project module by its dotted name."""
    found = {}
    for top in CODE:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def project_imports(name: str, path: Path) -> set[str]:
    """The project modules ``name`` imports (names that are attributes, not modules, are dropped)."""
    return {m for m in imported_names(path, name) if module_file(m) is not None and m != name}


def layer(name: str) -> int:
    for i, names in enumerate(LAYERS):
        if any(name == n or name.startswith(n + ".") for n in names.split()):
            return i
    raise AssertionError(f"{name} is in no layer of tests/test_layout.py's LAYERS: add it")


def as_deps(files: tuple[Path, ...]) -> set[str]:
    """The shortest dvc.yaml deps naming exactly ``files``: a folder where every module in it is among them."""
    chosen = {f.relative_to(ROOT) for f in files}
    deps = set()
    for f in chosen:
        folder = f.parent
        while folder != Path(".") and all(p.relative_to(ROOT) in chosen for p in (ROOT / folder).rglob("*.py")):
            f, folder = folder, folder.parent
        deps.add(str(f))
    return {d for d in deps if not any(d.startswith(other + "/") for other in deps)}


@pytest.mark.parametrize("stage", STAGES)
def test_each_stages_code_deps_are_exactly_the_code_it_imports(stage):
    declared = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"][stage]["deps"]
    listed = [d for d in declared if d.split("/")[0] in CODE]
    code = set(listed)
    assert len(code) == len(listed), f"dvc.yaml's {stage} stage lists a dep twice: {sorted(listed)}"
    expected = as_deps(code_files(STAGES[stage]))
    assert code == expected, (f"dvc.yaml's {stage} stage: missing {sorted(expected - code)}, not imported "
                              f"{sorted(code - expected)}; its code deps must be {sorted(expected)}")


def test_the_static_closure_covers_what_a_real_import_loads():
    """The AST walk misses nothing an import executes (it also follows imports inside functions, which an import
    does not run: so it may find more, never less)."""
    entries = [*STAGES.values(), "pipeline.nightly.rerun", TRAINABLE]
    script = (f"import sys\nfor m in {entries!r}: __import__(m)\n"
              "print('\\n'.join(getattr(m, '__file__', None) or '' for m in list(sys.modules.values())))")
    loaded = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    ours = {Path(f).resolve() for f in loaded.stdout.split() if f.startswith(tuple(f"{ROOT / top}/" for top in CODE))}
    assert ours and ours <= set(code_files(*entries))


@pytest.mark.parametrize("stage", ["pipeline.generate", "pipeline.report", "pipeline.sweep"])
def test_the_stages_command_lines_load_no_training_or_tracking_library_before_the_settings_hold(stage):
    """generate and report read and write tables: torch and Lightning would cost each of the 9 generate stages and
    the report seconds of imports (a verdict's status lives in ``pipeline/common/status.py`` for this); every stage
    checks its settings before it imports MLflow, Ray or the models, so a bad one is named in a second."""
    heavy = ("torch", "lightning", "mlflow", "ray")
    script = f"import sys, {stage}\nprint(sorted(m for m in {heavy} if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_the_reuse_key_follows_every_file_a_trial_runs_and_no_other(tmp_path):
    for top in CODE:
        shutil.copytree(ROOT / top, tmp_path / top, ignore=shutil.ignore_patterns("__pycache__"))
    before = code_hash(TRAINABLE, root=tmp_path)
    assert before == code_hash(TRAINABLE)
    names = {str(p.relative_to(ROOT)) for p in code_files(TRAINABLE)}
    assert {"tasks/base.py", "pipeline/scheduling/trainable.py", "pipeline/training/verdict.py"} <= names
    assert not {n for n in names if n.startswith(("pipeline/reporting", "pipeline/tracking", "pipeline/search"))}
    for changed, matters in (("pipeline/reporting/claims.py", False), ("tasks/base.py", True),
                             ("models/lstm.py", True), ("pipeline/scheduling/trainable.py", True)):
        with open(tmp_path / changed, "a") as f:
            f.write("\n# changed\n")
        after = code_hash(TRAINABLE, root=tmp_path)
        assert (after != before) == matters, changed
        before = after


def test_the_reuse_key_follows_the_installed_versions_of_the_training_libraries(tmp_path, monkeypatch):
    """Another torch, Lightning, Ray, NumPy, Numba or Triton under the same code: another key, so the sweep retrains.
    The other version is a real distribution on sys.path ahead of the venv's, as a library installed by hand is."""
    installed = library_versions()
    assert set(TRAINING_LIBRARIES) | {"python"} == set(installed)
    assert installed["torch"].startswith("2.") and installed["numpy"][0].isdigit()
    train = {"steps": 100, "lr": 1e-3}
    before = run_key(train)
    assert run_key(train) == before and run_key({**train, "steps": 101}) != before
    for name in ("torch", "ray"):
        bumped = tmp_path / name
        info = bumped / f"{name}-99.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 99.0\n")
        with monkeypatch.context() as path:
            path.syspath_prepend(str(bumped))
            assert library_versions()[name] == "99.0"
            assert {k: v for k, v in library_versions().items() if k != name} == {
                k: v for k, v in installed.items() if k != name}
            assert run_key(train) != before, name
        assert run_key(train) == before  # the venv's version back: the key back, its runs reused again
    sweep = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["sweep"]["deps"]
    assert "requirements.lock" in sweep  # a bump of the pins reruns the sweep stage, which then retrains


def test_imports_run_downward_and_never_in_a_cycle():
    graph = {name: project_imports(name, path) for name, path in modules().items()}
    upward = [f"{a} imports {b}" for a, bs in graph.items() for b in bs if layer(b) < layer(a)]
    assert not upward, upward
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            if state.get(other) == 1:
                cycle = path[path.index(other):] + [other]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if other in graph and other not in state:
                visit(other, [*path, other])
        state[name] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])


def test_no_entry_point_imports_another():
    """The top floor's modules are entry points (a stage, the nightly, the forecast, the launchers): what two of them
    share lives on a floor below both, so each runs, and changes, alone."""
    graph = {name: project_imports(name, path) for name, path in modules().items()}
    tops = LAYERS[0].split()

    def entry(name: str) -> str | None:
        return next((t for t in tops if name == t or name.startswith(t + ".")), None)

    sideways = sorted(f"{a} imports {b}" for a, bs in graph.items() for b in bs
                      if entry(a) and entry(b) and entry(a) != entry(b))  # fmt: skip
    assert not sideways, sideways


def test_training_and_tracking_import_no_ray():
    """Ray in a room of its own (``pipeline.scheduling``): a trial outside Tune, the forecast, the replay and the
    report run the training and tracking code without it (nor what that code imports), in the code and when imported."""
    found = modules()
    rayless = [name for name in found if any(name == p or name.startswith(p + ".") for p in RAYLESS)]
    reached = set(code_files(*rayless))
    uses_ray = sorted(f"{name} imports {imported}" for name, path in found.items() if path in reached
                      for imported in imported_names(path, name) if imported.split(".")[0] == "ray")
    assert not uses_ray, uses_ray
    script = f"import sys\nfor m in {rayless!r}: __import__(m)\nprint(sorted(m for m in sys.modules if m == 'ray'))"
    loaded = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_the_sweep_driver_loads_no_lightning():
    """The driver hands Tune the trainable by name (``tuning.run_cell``) and reads checkpoints and metric names from
    modules without the training loop: Lightning (with torchmetrics and SciPy) is imported in the trials' workers
    only, not once more in each sweep's driver."""
    heavy = ("lightning", "torchmetrics")
    script = f"import sys, pipeline.scheduling.driver\nprint([m for m in {heavy} if m in sys.modules])"
    loaded = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
