"""The committed-sweep jobs and the verdict on the paper's claim."""

import numpy as np
import pytest

from rpwjax import InputError, cli
from rpwjax.experiments import reproduce
from rpwjax.experiments.sweeps import COLUMNS, write_rows


def _rows(dataset, prior, cells):
    rows = []
    for (mechanism, config, eps), values in cells.items():
        for seed, v in enumerate(values):
            row = dict.fromkeys(COLUMNS, 0.0)
            row.update(dataset=dataset, mechanism=mechanism, prior=prior, config=config, epsilon=eps, seed=seed,
                       test_mse=v, label_mse=v)
            rows.append(row)
    return rows


def test_verdict_wins_ties_and_losses(tmp_path):
    cells = {
        ("rpwithprior", "default", 1.0): [1.0, 1.2], ("rpwithprior", "paper", 1.0): [0.50, 0.52],  # best of ours
        ("unbiased", "default", 1.0): [0.80, 0.82], ("laplace", "default", 1.0): [3.0, 3.1],
        ("rpwithprior", "default", 2.0): [0.50, 0.60], ("rr-on-bins", "default", 2.0): [0.52, 0.56],  # within a std
        ("rpwithprior+debias", "default", 4.0): [0.40, 0.40], ("unbiased", "default", 4.0): [0.30, 0.30],
        ("rpwithprior+posterior", "default", 4.0): [0.01, 0.01],  # not an RPWithPrior row of the paper: ignored
    }
    for prior, folder in (("private", tmp_path), ("empirical", tmp_path / "known-prior")):
        for dataset in ("california", "crime"):
            write_rows(_rows(dataset, prior, cells), folder / dataset / "results.csv")
    table = reproduce.verdict_table(tmp_path)
    assert len(table) == 12  # 2 settings x 2 data sets x 3 epsilons
    by_eps = {r["epsilon"]: r for r in table if r["dataset"] == "crime" and r["prior"] == "empirical"}
    assert by_eps[1.0]["verdict"] == "wins" and by_eps[1.0]["rpwithprior"] == "rpwithprior [paper]"
    assert by_eps[1.0]["baseline"] == "unbiased"
    assert np.isclose(by_eps[1.0]["margin"], (0.81 - 0.51) / 0.81)
    assert by_eps[2.0]["verdict"] == "tie"
    assert by_eps[4.0]["verdict"] == "loses" and by_eps[4.0]["rpwithprior"] == "rpwithprior+debias"
    text = reproduce.format_verdict(table)
    assert text.count("wins 2, ties 2, loses 2 of 6 cells") == 2


def test_every_job_is_a_valid_curves_command(tmp_path):
    parser = cli.build_parser()
    names = [job.name for job in reproduce.JOBS]
    assert len(set(names)) == len(names) and len({job.folder for job in reproduce.JOBS}) == len(names)
    for job in reproduce.JOBS:
        args = parser.parse_args(job.argv(tmp_path))
        assert args.func is cli.cmd_curves and args.out == str(tmp_path / job.folder)
    known = [j for j in reproduce.JOBS if j.folder.startswith("known-prior/")]
    assert {j.folder for j in known} == {"known-prior/crime", "known-prior/california"}
    assert all(parser.parse_args(j.argv(tmp_path)).prior == "empirical" for j in known)


def test_auto_table_applies_the_margin_and_tolerance_rules(tmp_path, monkeypatch):
    cells = {
        ("auto", "default", 1.0): [0.50, 0.52], ("unbiased", "default", 1.0): [0.60, 0.62],  # wins by > 1 std
        ("laplace", "default", 1.0): [0.9, 0.9], ("unbiased+feature-prior", "default", 1.0): [0.55, 0.57],
        ("auto", "default", 2.0): [0.50, 0.60], ("unbiased", "default", 2.0): [0.56, 0.58],  # lower, within a std
        ("auto", "default", 4.0): [0.305, 0.305], ("unbiased", "default", 4.0): [0.30, 0.30],  # 1.7% worse: met
        ("auto", "default", 8.0): [0.31, 0.31], ("rr-on-bins", "default", 8.0): [0.30, 0.30],  # 3.3% worse: not met
        ("two-stage", "default", 8.0): [0.01, 0.01],  # not one of the six: ignored
    }
    write_rows(_rows("crime", "private", cells), tmp_path / "auto" / "crime" / "results.csv")
    monkeypatch.setattr(reproduce, "auto_branches", lambda dataset, eps, split=0: dict.fromkeys(eps, "unbiased"))
    table = {r["epsilon"]: r for r in reproduce.auto_table(tmp_path)}
    assert [table[e]["met"] for e in (1.0, 2.0, 4.0, 8.0)] == [True, False, True, False]
    assert table[1.0]["baseline"] == "unbiased" and np.isclose(table[1.0]["margin"], (0.61 - 0.51) / 0.61)
    assert table[1.0]["fair"] == "unbiased+feature-prior" and np.isclose(table[1.0]["fair_margin"], (0.56 - 0.51) / 0.56)
    assert table[8.0]["baseline"] == "rr-on-bins" and table[8.0]["fair"] is None
    text = reproduce.auto_report(tmp_path)
    assert "crime: target met in 2 of 4 cells (2 seeds)" in text
    assert (tmp_path / "auto" / "target.md").read_text() == text + "\n"


def test_never_the_worse_bet_and_the_unseen_splits_summary(tmp_path, monkeypatch):
    cells = {
        ("auto", "default", 0.1): [0.50, 0.70], ("rpwithprior", "default", 0.1): [0.50, 0.52],  # mean within auto's
        # std (safe by the mean) but a spread 10 times the best mechanism's: the worse bet
        ("auto", "default", 1.0): [0.70, 0.72], ("unbiased", "default", 1.0): [0.60, 0.62],  # worse by > auto's std
        ("auto", "default", 2.0): [0.40, 0.42], ("unbiased", "default", 2.0): [0.60, 0.62],  # better: safe
        ("auto", "default", 4.0): [0.30, 0.50], ("unbiased", "default", 4.0): [0.60, 0.61],  # every seed better,
        # but a spread over twice the best mechanism's: the worse bet by the spread alone, and said so
    }
    for k in (*reproduce.UNSEEN_SPLITS[:2], reproduce.EARLIER_SPLITS[0]):
        write_rows([dict(r, split_seed=k) for r in _rows("crime", "private", cells)],
                   tmp_path / reproduce.SPLITS / f"split-{k}" / "crime" / "results.csv")
    seen = []
    monkeypatch.setattr(reproduce, "auto_branches",
                        lambda dataset, eps, split=0: seen.append(split) or dict.fromkeys(eps, "denoised"))
    tables = reproduce.split_tables(tmp_path)
    assert sorted(tables) == list(reproduce.UNSEEN_SPLITS[:2])
    by_eps = {t["epsilon"]: t for t in tables[reproduce.UNSEEN_SPLITS[0]]}
    assert by_eps[0.1]["safe_mean"] and not by_eps[0.1]["safe_std"] and not by_eps[0.1]["safe"]
    assert not by_eps[1.0]["safe_mean"] and by_eps[1.0]["safe_std"]
    assert by_eps[2.0]["safe"] and by_eps[2.0]["met"]
    text = reproduce.auto_report(tmp_path)
    first, second = reproduce.UNSEEN_SPLITS[:2]
    assert f"crime: target met in 4 of 8 cells (splits {first}, {second}; 2 seeds each); never the worse bet in 2 " \
           "of 8 (of the others, 2 fail on the spread alone" in text
    # the splits judged before the rule's last change: their own summary, never mixed into the judged one
    earlier = (tmp_path / reproduce.SPLITS / "summary-splits-1-3.md").read_text()
    assert f"(splits {reproduce.EARLIER_SPLITS[0]}; 2 seeds each)" in earlier and earlier in text + "\n"
    assert "**no** (spread)" in text and "**no** (mean)" in text
    assert by_eps[4.0]["every_seed_better"] and not by_eps[4.0]["safe"] and by_eps[4.0]["met"]
    assert "every seed better than every seed of the best of the six" in text
    assert (tmp_path / reproduce.SPLITS / "summary.md").read_text() in text + "\n"
    split_one = (tmp_path / reproduce.SPLITS / f"split-{first}" / "target.md").read_text()
    assert "never the worse bet in 1 of 4" in split_one
    assert set(seen) == {first, second, reproduce.EARLIER_SPLITS[0]}


def test_the_committed_auto_sweep_covers_both_data_sets_every_epsilon_and_five_seeds():
    from pathlib import Path

    from rpwjax.experiments.sweeps import PAPER_EPSILONS, read_rows

    root = Path(__file__).resolve().parents[1] / "plots" / "auto"
    for dataset in ("california", "crime"):
        rows = read_rows(root / dataset / "results.csv")
        for name in ("auto", "laplace", "gaussian", "staircase", "rr-on-bins", "unbiased", "rpwithprior",
                     *reproduce.FAIR):
            for eps in PAPER_EPSILONS:
                seeds = {r["seed"] for r in rows if r["mechanism"] == name and r["epsilon"] == eps}
                assert len(seeds) >= 5, (dataset, name, eps)


def test_validation_table_averages_folds_and_counts_unbiased_wins(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "VALIDATION_EPSILONS", {"crime": ("1", "4")})
    folds = {777: {1.0: (0.02, 0.03), 4.0: (0.022, 0.020)}, 11: {1.0: (0.03, 0.02), 4.0: (0.024, 0.021)}}
    for seed, cells in folds.items():
        rows = {}
        for eps, (den, unb) in cells.items():
            rows[("auto-denoised", "default", eps)] = [den, den]
            rows[("auto-unbiased", "default", eps)] = [unb - 0.001, unb + 0.001]
        write_rows(_rows("crime", "private", rows), tmp_path / "auto" / "validation" / "crime" / f"seed-{seed}" /
                   "results.csv")
    table = {t["epsilon"]: t for t in reproduce.validation_table(tmp_path)}
    assert set(table) == {1.0, 4.0} and table[1.0]["folds"] == 2
    assert np.isclose(table[1.0]["denoised_mse"], 0.025) and np.isclose(table[4.0]["unbiased_mse"], 0.0205)
    assert table[1.0]["unbiased_wins"] == 1 and table[4.0]["unbiased_wins"] == 2
    # Q and the rule's branch are the plan's on the fold's training rows (public numbers)
    from rpwjax.pipelines import auto

    for t in table.values():
        assert t["rule"] == ("unbiased" if t["q"] < auto.DEFAULT_RULE.unbiased_below else "denoised")
        assert np.isclose(t["q"], auto.uniform_unbiased_variance(t["epsilon"]) * 12 / t["rows"])
    text = reproduce.auto_report(tmp_path)
    assert (tmp_path / "auto" / "validation.md").read_text() == text + "\n"
    assert "| crime | 4 | " in text and "2 of 2 folds" in text


def test_the_committed_validation_folds_are_complete_and_their_table_current():
    from pathlib import Path

    from rpwjax.experiments.sweeps import read_rows

    root = Path(__file__).resolve().parents[1] / "plots"
    for dataset, epsilons in reproduce.VALIDATION_EPSILONS.items():
        for seed in reproduce.VALIDATION_SEEDS:
            rows = read_rows(root / "auto" / "validation" / dataset / f"seed-{seed}" / "results.csv")
            for name in ("auto-denoised", "auto-unbiased", "unbiased"):
                for eps in map(float, epsilons):
                    assert len({r["seed"] for r in rows if r["mechanism"] == name and r["epsilon"] == eps}) == 3
    text = reproduce.format_validation_table(reproduce.validation_table(root))
    assert (root / "auto" / "validation.md").read_text() == text + "\n"


def test_the_readme_quotes_the_committed_auto_table_and_benchmark_run():
    """The README's auto table is ``plots/auto/target.md`` as the committed sweeps and the current rule give it
    (the branch column is the rule's plan), and its benchmark table is the committed run's targets."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    text = reproduce.format_auto_table(reproduce.auto_table(root / "plots"))
    assert (root / "plots" / "auto" / "target.md").read_text() == text + "\n"
    assert text in readme
    # the replicate on fresh seeds, the same table from its own tree
    fresh = reproduce.format_auto_table(reproduce.auto_table(root / "plots" / reproduce.FRESH))
    assert (root / "plots" / reproduce.FRESH / "auto" / "target.md").read_text() == fresh + "\n"
    assert fresh in readme and "--first-seed" in readme
    assert {j.name for j in reproduce.JOBS} >= {f"auto-fresh-{d}" for d in reproduce.FRESH_DATASETS}
    # the unseen splits and the rerun ones: each split's table and the summary beside them; in the README the
    # judged summary and the first rerun group's whole, the other rerun groups by their counts per data set
    assert reproduce.SPLIT_SUMMARIES[0] == (reproduce.UNSEEN_SPLITS, "summary.md")
    assert {j.name for j in reproduce.JOBS} >= {f"auto-split-{k}-{d}" for chosen, _ in reproduce.SPLIT_SUMMARIES
                                                for k in chosen for d in reproduce.AUTO_DATASETS}
    for chosen, name in reproduce.SPLIT_SUMMARIES:
        splits = reproduce.split_tables(root / "plots", chosen)
        assert sorted(splits) == list(chosen)
        for k, table in splits.items():
            assert {t["split"] for t in table} == {k}
            assert {t["dataset"] for t in table} == set(reproduce.AUTO_DATASETS)
            path = root / "plots" / reproduce.SPLITS / f"split-{k}" / "target.md"
            assert path.read_text() == reproduce.format_auto_table(table) + "\n"
        summary = reproduce.format_split_summary(splits)
        assert (root / "plots" / reproduce.SPLITS / name).read_text() == summary + "\n"
        counts = [line for line in summary.splitlines() if ": target met in " in line]
        assert len(counts) == len(reproduce.AUTO_DATASETS) and all(line in readme for line in counts), name
        if chosen in (reproduce.UNSEEN_SPLITS, reproduce.RERUN_SPLITS[0]):  # the README shows these whole
            assert summary in readme and "--split-seed" in readme
        else:  # the other rerun groups by their counts (above) and the summary's path
            assert f"plots/auto-splits/{name}" in readme
    run = json.loads((root / "benchmarks" / "results" / "cpu" / "results.json").read_text())
    assert run["errors"] == [] and run["targets"]
    for target in run["targets"].values():
        row = (f"| {target['description']} | {target['value']:.4g} | {target['op']} {target['threshold']:g} | "
               f"{'yes' if target['met'] else 'no'} |")
        assert row in readme, row


def test_the_readme_results_tables_are_the_committed_sweeps():
    """Each of the README's results tables (per prior setting and data set) is what ``markdown_tables`` makes of
    the committed sweep's CSV today: a rerun or an edit of either shows here."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    for prior, folder in (("private", root / "plots"), ("empirical", root / "plots" / "known-prior")):
        for dataset in ("california", "crime"):
            table = reproduce.markdown_tables(folder / dataset / "results.csv", prior)
            assert table.startswith(f"**{dataset}**") and table.count("\n| ") >= 11  # header and ten epsilons
            assert table in readme, (prior, dataset)


@pytest.mark.long
@pytest.mark.slow
def test_run_jobs_runs_each_job_in_its_own_process_and_logs_it(tmp_path, monkeypatch):
    tiny = reproduce.Job("tiny", "tiny", ("--dataset", "crime", "--mechanisms", "laplace", "--epsilon", "1",
                                         "--seeds", "1", "--epochs", "1"))
    bad = reproduce.Job("bad", "bad", ("--dataset", "crime", "--epsilon", "-1"))
    monkeypatch.setattr(reproduce, "JOBS", (tiny, bad))
    [(name, seconds)] = reproduce.run_jobs(tmp_path, ["tiny"])
    assert name == "tiny" and seconds > 0
    assert (tmp_path / "tiny" / "results.csv").exists() and "laplace" in (tmp_path / "logs" / "tiny.txt").read_text()
    assert (tmp_path / "logs" / "times.txt").read_text().startswith("tiny: ")
    with pytest.raises(RuntimeError, match="job bad failed with exit code 2"):
        reproduce.run_jobs(tmp_path, ["bad"])
    assert "epsilon" in (tmp_path / "logs" / "bad.txt").read_text()  # the one-line error reached the log
    with pytest.raises(InputError, match="job must be one of tiny, bad, got 'nope'"):
        reproduce.run_jobs(tmp_path, ["nope"])
