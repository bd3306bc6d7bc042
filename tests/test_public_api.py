"""The public namespace and the README's Python examples."""

import re
import types
from pathlib import Path

import numpy as np
import pytest

import rpwjax

ROOT = Path(__file__).resolve().parents[1]


def test_all_is_sorted_complete_and_resolves():
    assert rpwjax.__all__ == sorted(rpwjax.__all__)
    assert len(set(rpwjax.__all__)) == len(rpwjax.__all__)
    for name in rpwjax.__all__:
        assert hasattr(rpwjax, name), name
    public = {name for name, value in vars(rpwjax).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert public == set(rpwjax.__all__), f"exported but not in __all__: {sorted(public - set(rpwjax.__all__))}"


def test_every_registered_mechanism_is_exported():
    for entry in rpwjax.MECHANISMS.values():
        assert getattr(rpwjax, entry.fit.__name__) is entry.fit
        assert getattr(rpwjax, entry.params.__name__) is entry.params


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


@pytest.mark.slow
def test_readme_python_examples_run_as_written(tmp_path, monkeypatch):
    blocks = python_blocks(ROOT / "README.md")
    assert blocks, "the README has Python examples"
    rng = np.random.default_rng(0)
    np.savetxt(tmp_path / "labels.txt", 5.0 * rng.beta(2.0, 5.0, 400))  # the file the examples read
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__readme__"}
    for block in blocks:  # in order, in one namespace, as a reader pastes them
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    # the first example releases one row per ε of its grid, in float64
    assert namespace["released"].shape == (3, 400) and namespace["released"].dtype == np.float64
