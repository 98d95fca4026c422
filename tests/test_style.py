"""The habits that keep the code readable, run by the README's test command (and so by .ci/run), with the settings
in pyproject.toml: ruff's lint over pipeline/, tasks/, models/, benchmarks/, tests/ and docs/examples/ (the worked
examples of docs/contributing.md); ruff's format over pipeline/, tasks/, models/ and docs/examples/; mypy over
pipeline/, tasks/, models/ and benchmarks/ (whose GPU paths no CPU test runs: the types are what checks them here)."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from tests.helpers import ROOT

CODE = ["pipeline", "tasks", "models"]
EXAMPLES = ["docs/examples"]  # written as the code they show how to add
LINTED = [*CODE, "benchmarks", "tests", *EXAMPLES]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "command",
    [["ruff", "check", *LINTED], ["ruff", "format", "--check", *CODE, *EXAMPLES],
     pytest.param(["mypy"], marks=pytest.mark.slow)],  # mypy: a minute on 2 cores
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_the_code_is_clean(command):
    done = subprocess.run([str(BIN / command[0]), *command[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-5000:]}{done.stderr[-2000:]}"


DOTTED = re.compile(r"(?<![\w/.-])((?:pipeline|tasks|models|benchmarks|tests)(?:\.[A-Za-z_]\w*)+)")
FILE_NAME = re.compile(r"\.(csv|json|jsonl|md|py|yaml)$")  # docs/benchmarks.md is a file, not a module
SETTING = re.compile(r"`((?:generate|sweep|report|nightly|cluster|decides)(?:\.[a-z_]+)+)`")
NOT_SETTINGS = re.compile(r"\.(csv|json|md|py|jsonl|yaml)$|^nightly\.(date|commit)$|^sweep\.max_steps$")  # files;
# the nightly's MLflow tags; the flat key the docs name as moved


def written_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "conf").glob("*.yaml")),
            ROOT / "params.yaml", *(p for top in LINTED if top != "docs/examples" for p in sorted((ROOT / top).rglob(
                "*.py")))]  # fmt: skip


def resolves(name: str) -> bool:
    """A dotted name is a module of this checkout, or an attribute (or a declared field) of one."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            continue
        obj: object = importlib.import_module(module)
        for attr in parts[i:]:
            fields = {**getattr(obj, "__annotations__", {}), **getattr(obj, "model_fields", {})}
            if not hasattr(obj, attr) and attr not in fields:
                return False
            obj = getattr(obj, attr, None)
        return True
    return False


def setting_resolves(key: str) -> bool:
    """A settings key (``sweep.search.lr``) names a field of the config's sections, down to a leaf or a mapping (whose
    keys, a task or an architecture, are the profile's)."""
    from pipeline.common.config import Config

    model: type | None = Config
    for part in key.split("."):
        if model is None:
            return True  # a key of a mapping
        field = model.model_fields.get(part)  # type: ignore[attr-defined]
        if field is None:
            return False
        args = typing.get_args(field.annotation) or (field.annotation,)
        model = next((a for a in args if isinstance(a, type) and hasattr(a, "model_fields")), None)
    return True


def test_every_dotted_reference_in_the_docs_and_the_code_resolves():
    """A module, attribute or setting named in the README, docs/, the profiles or a docstring exists: a rename
    leaves no stale pointer (a test module and a setting, renamed, once were)."""
    stale = set()
    for path in written_files():
        text = path.read_text()
        if path.suffix == ".py":  # in code: what a comment or a docstring's backticks name, not a variable's use
            text = "\n".join([*re.findall(r"#.*", text), *re.findall(r"``?[^`\n]+``?", text)])
        names = {m for m in DOTTED.findall(text) if not FILE_NAME.search(m)}
        stale |= {(path.relative_to(ROOT).as_posix(), m) for m in names if not resolves(m)}
        stale |= {(path.relative_to(ROOT).as_posix(), k) for k in SETTING.findall(text)
                  if not NOT_SETTINGS.search(k) and not setting_resolves(k)}  # fmt: skip
    assert not stale, sorted(stale)


def test_the_docs_prose_is_wrapped_at_120_characters():
    """README.md and docs/ read in an editor as the code does: prose lines at most 120 characters (ruff's line
    length); a table row or a line in a code block may be longer, since wrapping would break it."""
    long = []
    for path in (p for p in written_files() if p.suffix == ".md"):
        in_code = False
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
            elif not in_code and len(line) > 120 and not line.lstrip().startswith("|"):
                long.append(f"{path.relative_to(ROOT)}:{number} ({len(line)})")
    assert not long, long


def test_no_class_name_is_defined_twice():
    """A reader finds a concept by its name: one class a name across the code and the benchmarks (two ``Verdict``
    classes, a claim's and a trial's, once were)."""
    where: dict[str, list[str]] = {}
    for top in [*CODE, "benchmarks"]:
        for path in sorted((ROOT / top).rglob("*.py")):
            for name in re.findall(r"^class (\w+)", path.read_text(), flags=re.M):
                where.setdefault(name, []).append(path.relative_to(ROOT).as_posix())
    assert not {name: paths for name, paths in where.items() if len(paths) > 1}
