"""The installed package, imported from outside the source tree, carries everything it needs.

The tests import ``rpwjax`` from the repository (pytest runs in its root), so
a file missing from the installed package (a data set, a subpackage) would
go unnoticed there. This test starts a fresh interpreter in an empty
directory, with nothing of the repository on its path, and uses the package
as a user's script would.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, rpwjax
from rpwjax.experiments.datasets import load_dataset
from rpwjax.mechanisms import MECHANISMS
from rpwjax.pipelines import PIPELINES
import rpwjax.audit.checks, rpwjax.bench.report, rpwjax.experiments.reproduce, rpwjax.cli
sizes = {name: load_dataset(name).n for name in ("california", "crime", "randhie")}
print(json.dumps({"file": rpwjax.__file__, "sizes": sizes, "mechanisms": sorted(MECHANISMS), "pipelines": sorted(PIPELINES)}), flush=True)
"""


def test_installed_package_has_its_data_and_subpackages(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # -X faulthandler: a native abort (SIGABRT) prints every thread's Python stack into stderr
    proc = subprocess.run([sys.executable, "-I", "-X", "faulthandler", "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, ("the installed rpwjax does not work from outside the source tree (install it: "
                                  f"pip install '.[test]'):\nstdout: {proc.stdout[-300:]!r}\nstderr (the threads' stacks first): "
                                  f"{proc.stderr[:3000]}\n...\n{proc.stderr[-500:]}")
    import json

    info = json.loads(proc.stdout.strip().splitlines()[-1])
    from rpwjax.mechanisms import MECHANISMS
    from rpwjax.pipelines import PIPELINES

    assert info["sizes"] == {"california": 20640, "crime": 1994, "randhie": 20190}
    assert info["mechanisms"] == sorted(MECHANISMS) and len(MECHANISMS) == 6
    assert info["pipelines"] == sorted(PIPELINES) and "auto" in PIPELINES
    installed = Path(info["file"]).resolve()
    # a non-editable install (CI) imports from site-packages; an editable one from this tree, via the installer's hook
    assert installed.name == "__init__.py" and installed.parent.name == "rpwjax"
