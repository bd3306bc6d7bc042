"""Every committed sweep, regenerated from the code: ``rpwjax reproduce [--out plots]``.

Each job is one ``rpwjax curves`` run (same arguments a reader can run
alone), written into its own folder of ``plots/``: the tidy ``results.csv``
beside the figure drawn from it. The paper's two settings: ``plots/DATASET/``
(unknown prior: a private histogram costs ε₁) and ``plots/known-prior/DATASET/``
(the prior assumed public), each with RPWithPrior in the default and the
paper's configuration and debiased. The combined beyond-the-paper report
(:func:`beyond_report`) then draws the paper-setting rows and the
beyond-the-paper rows together, writes the rows it drew beside each figure,
and writes the target table. The standard output of each job goes to
``plots/logs/NAME.txt`` and its wall time to ``plots/logs/times.txt``
(about 44 minutes on 2 CPU cores in all).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import numpy as np

LOW_EPSILONS = ("0.05", "0.1", "0.3", "0.5", "0.8", "1", "1.5", "2")
BEYOND_VARIANTS = ("rpwithprior+calibrated", "two-stage", "two-stage-rpwithprior", "two-stage-unbiased", "linear-prior")
DATASETS = ("crime", "california")
MAX_BEYOND_EPSILON = 2.0


@dataclasses.dataclass(frozen=True)
class Job:
    """One committed sweep: ``rpwjax curves ARGS --out OUT/FOLDER``."""

    name: str
    folder: str
    args: tuple[str, ...]

    def argv(self, out: Path) -> list[str]:
        return ["curves", *self.args, "--out", str(out / self.folder), "--quiet"]


def _jobs() -> list[Job]:
    # the paper's two settings, each with the default and the paper's configuration and the debiased rows
    jobs = [Job(d, d, ("--dataset", d, "--seeds", "3", "--config", "default", "paper", "--denoise", "debias"))
            for d in DATASETS]
    jobs += [Job(f"{d}-known-prior", f"known-prior/{d}", ("--dataset", d, "--seeds", "3", "--prior", "empirical",
                                                            "--config", "default", "paper", "--denoise", "debias"))
             for d in DATASETS]
    jobs += [Job(f"posterior-{d}", f"posterior-denoising/{d}",
                 ("--dataset", d, "--mechanisms", "rpwithprior", "rr-on-bins", "unbiased",
                  "--denoise", "rpwithprior", "rr-on-bins", "unbiased", "--epsilon", *LOW_EPSILONS, "--seeds", "3"))
             for d in DATASETS]
    jobs += [Job(f"beyond-{d}", f"beyond/{d}", ("--dataset", d, "--mechanisms", "rpwithprior", "--variants",
                                                 *BEYOND_VARIANTS, "--epsilon", *LOW_EPSILONS, "--seeds", "3"))
             for d in DATASETS]
    jobs.append(Job("beyond-california-5-seeds", "beyond/california-5-seeds",
                    ("--dataset", "california", "--mechanisms", "unbiased", "--variants", "two-stage-unbiased",
                     "--epsilon", "1", "1.5", "2", "--seeds", "5")))
    return jobs


JOBS: tuple[Job, ...] = tuple(_jobs())


def run_jobs(out, only=None) -> list[tuple[str, float]]:
    """Run the jobs (all, or those named in ``only``) into ``out``; returns (name, seconds) per job."""
    from rpwjax import cli
    from rpwjax.errors import InputError

    out = Path(out)
    names = [j.name for j in JOBS]
    for name in only or ():
        if name not in names:
            raise InputError(f"job must be one of {', '.join(names)}, got {name!r}")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    times = []
    for job in JOBS:
        if only and job.name not in only:
            continue
        start = time.perf_counter()
        with open(logs / f"{job.name}.txt", "w") as log, contextlib.redirect_stdout(log):
            code = cli.main(job.argv(out))
        if code != 0:
            raise RuntimeError(f"job {job.name} failed with exit code {code} (see {logs / (job.name + '.txt')})")
        seconds = time.perf_counter() - start
        times.append((job.name, seconds))
        with open(logs / "times.txt", "a") as f:
            f.write(f"{job.name}: {seconds:.0f} s\n")
    return times


def beyond_report(out) -> str:
    """The beyond-the-paper figures and target table from the committed rows in ``out``.

    The paper-setting sweep (``DATASET/results.csv``) and the beyond sweep
    (``beyond/DATASET/results.csv``) use the same protocol, split and seeds;
    the beyond sweep reruns plain RPWithPrior, and its rows must match the
    committed ones (a check that the two runs are comparable). Writes
    ``beyond/DATASET/DATASET_curves.png`` with the rows it was drawn from
    beside it (``beyond/DATASET/curves.csv``) and ``beyond/target.md``;
    returns the table.
    """
    from rpwjax.experiments.plots import plot_curves
    from rpwjax.experiments.sweeps import format_target_table, read_rows, summarize, target_table, write_rows
    from rpwjax.mechanisms import MECHANISMS

    out = Path(out)
    combined = []
    for dataset in ("california", "crime"):
        paper = [r for r in read_rows(out / dataset / "results.csv")
                 if r["epsilon"] <= MAX_BEYOND_EPSILON or r["mechanism"] == "non-private"]
        beyond = read_rows(out / "beyond" / dataset / "results.csv")
        committed = {(r["epsilon"], r["seed"]): r for r in paper if r["mechanism"] == "rpwithprior"}
        for r in beyond:
            if r["mechanism"] == "rpwithprior":
                c = committed[(r["epsilon"], r["seed"])]
                if not np.isclose(r["label_mse"], c["label_mse"], rtol=1e-9):
                    raise RuntimeError(f"{dataset}: rpwithprior eps={r['epsilon']} seed={r['seed']} differs from the "
                                       "committed paper-setting sweep: the two runs are not comparable")
        rows = paper + [r for r in beyond if r["mechanism"] not in MECHANISMS and r["mechanism"] != "non-private"]
        write_rows(rows, out / "beyond" / dataset / "curves.csv")
        plot_curves(rows, out / "beyond" / dataset)
        combined += rows
    table = format_target_table(target_table(summarize(combined), max_epsilon=MAX_BEYOND_EPSILON))
    (out / "beyond" / "target.md").write_text(table + "\n")
    return table
