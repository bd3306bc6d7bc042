import os
from pathlib import Path

import jax
import numpy as np
import pytest

# JAX's persistent compilation cache, for the tests only (git-ignored, under .pytest_cache): most of a test
# run is XLA compiling the same programs again, so a rerun of the fast subset takes about 1½-2 minutes instead
# of about 2½. A clean clone starts empty (CI compiles each program once per run). Set JAX_COMPILATION_CACHE_DIR
# to use another directory.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    jax.config.update("jax_compilation_cache_dir",
                      str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "jax-compilation-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.05)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


LONG_TESTS = Path(__file__).with_name("long_tests.txt")


def long_test_ids() -> dict:
    """The node ids listed in tests/long_tests.txt, with the seconds each took when it was listed."""
    ids = {}
    for line in LONG_TESTS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            seconds, nodeid = line.split(maxsplit=1)
            ids[nodeid.strip()] = float(seconds)
    return ids


@pytest.hookimpl(tryfirst=True)  # before the -m selection reads the marks
def pytest_collection_modifyitems(config, items):
    """Every test listed in tests/long_tests.txt (8 s or more in a full run) is a long check: ``long`` and
    ``slow``, so the README's test command and the fast subset leave it to ``pytest -m long``."""
    listed = long_test_ids()
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.long)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _own_ledger(tmp_path_factory, monkeypatch):
    """Each test's releases without a key file go to a ledger of its own (never the user's per-user ledger)."""
    monkeypatch.setenv("RPWJAX_LEDGER", str(tmp_path_factory.mktemp("ledger") / "ledger.jsonl"))


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


def _memory_maps() -> int | None:
    """Memory mappings this process holds (Linux), or None where /proc cannot tell."""
    try:
        with open(f"/proc/{os.getpid()}/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def _map_limit() -> int:
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return 65530  # the kernel's default


@pytest.fixture(autouse=True, scope="module")
def _fresh_jax_caches():
    """Empty JAX's compilation caches after a module only when the process's memory mappings near the limit.

    XLA's CPU backend maps every compiled executable's code into memory: about 2 mappings for a tiny program,
    15-20 for a typical one here (measured: 300 small jitted functions took 5,500). A full run that holds every
    executable of every module would pass Linux's default limit of 65,530 mappings per process
    (vm.max_map_count), and then the compiler's next allocation fails: the likely cause of the crash a full
    run once had late in the run (not reproduced since). Clearing after every module dodged it but made each
    module recompile everything; clearing only past half the limit keeps the executables a run reuses and
    stays far from it. Where /proc cannot tell (not Linux), every module still starts empty.
    """
    yield
    maps = _memory_maps()
    if maps is None or maps > _map_limit() // 2:
        jax.clear_caches()


FEWER_FRESH_LABELS = 512  # two of the realized check's stream batches of 256 labels


@pytest.fixture
def fewer_fresh_labels(monkeypatch):
    """Audits in the test (``audit_mechanism``, ``rpwjax audit``) draw FEWER_FRESH_LABELS fresh random labels for
    the realized check instead of the shipped 4,096, which cost most of a full run's time; the audit is otherwise
    the shipped one. tests/test_audit.py runs every registered mechanism with the shipped count under the
    ``long`` marker."""
    from rpwjax.audit.checks import audit_mechanism

    monkeypatch.setitem(audit_mechanism.__kwdefaults__, "fresh_labels", FEWER_FRESH_LABELS)
    return FEWER_FRESH_LABELS


@pytest.fixture
def histogram_epsilons(monkeypatch):
    """The ε of every integer-noise histogram release, in order, as the noise sampler receives it
    (:func:`rpwjax.noise.noisy_counts`, which every histogram release calls)."""
    import rpwjax.noise

    seen, real = [], rpwjax.noise.noisy_counts

    def spy(counts, epsilon, secret, purpose, *index):
        seen.append(float(epsilon))
        return real(counts, epsilon, secret, purpose, *index)

    monkeypatch.setattr(rpwjax.noise, "noisy_counts", spy)
    return seen
