"""Sweeps: tidy rows, reproducible cells, plots, user data through --data."""

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from rpwjax import api, cli
from rpwjax.experiments.datasets import load_dataset, train_test_split
from rpwjax.errors import InputError
from rpwjax.experiments.sweeps import COLUMNS, NON_PRIVATE, SweepConfig, privatize_grid, run_sweep, summarize


@pytest.fixture(scope="module")
def crime_split():
    return train_test_split(load_dataset("crime"), seed=0)


@pytest.fixture(scope="module")
def small_sweep(crime_split):
    config = SweepConfig(mechanisms=("rpwithprior", "laplace"), epsilons=(0.5, 4.0), seeds=2, epochs=2)
    return run_sweep(crime_split, config, progress=False)


@pytest.fixture(scope="module")
def tiny_sweep(crime_split):
    """The fast subset's sweep: one mechanism, one ε, two seeds, one epoch."""
    config = SweepConfig(mechanisms=("laplace",), epsilons=(1.0,), seeds=2, epochs=1)
    return run_sweep(crime_split, config, progress=False)


def test_a_tiny_sweep_has_one_tidy_row_per_cell(tiny_sweep):
    assert all(set(r) == set(COLUMNS) for r in tiny_sweep)
    assert all(r["split_seed"] == 0 for r in tiny_sweep)
    cells = sorted((r["mechanism"], r["epsilon"], r["seed"]) for r in tiny_sweep if r["mechanism"] != NON_PRIVATE)
    assert cells == [("laplace", 1.0, 0), ("laplace", 1.0, 1)]
    assert sum(r["mechanism"] == NON_PRIVATE for r in tiny_sweep) == 2
    assert all(np.isfinite(r["test_mse"]) and r["test_mse"] > 0 for r in tiny_sweep)


@pytest.mark.slow
def test_rows_are_tidy_and_complete(small_sweep):
    assert all(set(r) == set(COLUMNS) for r in small_sweep)
    cells = {(r["mechanism"], r["epsilon"], r["seed"]) for r in small_sweep}
    assert len(cells) == len(small_sweep) == 2 * 2 * 2 + 2
    assert {r["mechanism"] for r in small_sweep} == {"rpwithprior", "laplace", NON_PRIVATE}
    for r in small_sweep:
        assert np.isfinite(r["test_mse"]) and r["test_mse"] > 0
        if r["mechanism"] == "laplace":  # mean of X^2, X ~ Lap(b): 2 b^2, sd sqrt(20) b^2 / sqrt(n)
            b, n = 1.0 / r["epsilon"], 1596
            assert abs(r["label_mse"] - 2 * b**2) < 5 * np.sqrt(20) * b**2 / np.sqrt(n)


@pytest.mark.slow
def test_one_cell_rerun_alone_reproduces(crime_split, small_sweep):
    config = SweepConfig(mechanisms=("rpwithprior",), epsilons=(4.0,), seeds=2, epochs=2)
    again = run_sweep(crime_split, config, progress=False)
    for r in again:
        if r["mechanism"] == NON_PRIVATE:
            continue
        (orig,) = [o for o in small_sweep if (o["mechanism"], o["epsilon"], o["seed"]) == (r["mechanism"], r["epsilon"], r["seed"])]
        assert r["label_mse"] == orig["label_mse"]  # identical noisy labels
        assert r["test_mse"] == pytest.approx(orig["test_mse"], rel=1e-3)  # float32 batched training


def test_fresh_seeds_replicate_a_sweep_with_other_draws(crime_split, tiny_sweep):
    """first_seed = 1 runs seed 1 and 2: seed 1's row is the tiny sweep's own (same labels, same model seed),
    seed 2's labels are new draws."""
    config = SweepConfig(mechanisms=("laplace",), epsilons=(1.0,), seeds=2, first_seed=1, epochs=1)
    again = run_sweep(crime_split, config, progress=False)
    seen = {r["seed"]: r for r in again if r["mechanism"] == "laplace"}
    assert sorted(seen) == [1, 2] and sorted(r["seed"] for r in again if r["mechanism"] == NON_PRIVATE) == [1, 2]
    (one,) = [r for r in tiny_sweep if r["mechanism"] == "laplace" and r["seed"] == 1]
    assert seen[1]["label_mse"] == one["label_mse"]
    assert seen[1]["test_mse"] == pytest.approx(one["test_mse"], rel=1e-3)
    assert seen[2]["label_mse"] not in {r["label_mse"] for r in tiny_sweep}


def test_privatize_grid_releases_every_epsilon_on_its_public_grid(crime_split):
    y, lo, hi = crime_split.y_train, crime_split.lo, crime_split.hi
    fit = api.fit("laplace", y, range=(lo, hi), epsilon=[0.5, 4.0], prior="empirical")
    noisy = privatize_grid(fit, 0, "laplace", y)
    assert noisy.shape == (2, y.size) and noisy.dtype == np.float64
    for i in range(2):
        spec = fit.params[i].release_spec()
        steps = noisy[i] / spec["grid"]
        assert np.array_equal(steps, np.rint(steps))  # snapped to the public grid
        assert np.all((noisy[i] >= spec["low"]) & (noisy[i] <= spec["high"]))  # clamped to the public range
    # reproducible per (seed, mechanism, ε value): the same call repeats, another seed or mechanism does not,
    # and one ε released alone gives its row of the grid
    np.testing.assert_array_equal(privatize_grid(fit, 0, "laplace", y), noisy)
    assert not np.any(np.all(privatize_grid(fit, 1, "laplace", y) == noisy, axis=1))
    assert not np.any(np.all(privatize_grid(fit, 0, "gaussian", y) == noisy, axis=1))
    alone = api.fit("laplace", y, range=(lo, hi), epsilon=[4.0], prior="empirical")
    np.testing.assert_array_equal(privatize_grid(alone, 0, "laplace", y)[0], noisy[1])


def test_summary_has_mean_and_std(tiny_sweep):
    s = summarize(tiny_sweep)
    lap = [c for c in s if c["mechanism"] == "laplace" and c["epsilon"] == 1.0][0]
    vals = [r["test_mse"] for r in tiny_sweep if r["mechanism"] == "laplace" and r["epsilon"] == 1.0]
    assert len(vals) == 2
    assert lap["test_mse_mean"] == pytest.approx(np.mean(vals)) and lap["test_mse_std"] == pytest.approx(np.std(vals, ddof=1))


def test_plot_curves_draws_one_figure_per_dataset(tiny_sweep, tmp_path):
    from rpwjax.experiments.plots import plot_curves

    paths = plot_curves(tiny_sweep, tmp_path / "plots")
    assert paths == [tmp_path / "plots" / "crime_curves.png"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths[0].stat().st_size > 10_000


@pytest.mark.slow
def test_curves_on_unseen_user_data(tmp_path, capsys):
    rng = np.random.default_rng(3)
    n = 1200
    x = rng.normal(size=(n, 3))
    y = np.clip(10 + 3 * x[:, 0] - 2 * x[:, 1] + rng.normal(size=n), 0, 20)
    pacsv.write_csv(pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "target": y}), tmp_path / "mine.csv")
    code = cli.main(["curves", "--data", str(tmp_path / "mine.csv"), "--label-column", "target", "--range", "0", "20",
                     "--mechanisms", "rpwithprior", "rr-on-bins", "--epsilon", "1", "--seeds", "1", "--epochs", "2",
                     "--split-seed", "2", "--out", str(tmp_path / "out"), "--quiet"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0
    # an experiment on the user's own labels says, even with --quiet, that its results are not private
    assert "rpwjax curves: warning: an experiment, not a release" in captured.err and "not private" in captured.err
    assert (tmp_path / "out" / "results.csv").exists() and (tmp_path / "out" / "mine_curves.png").exists()
    assert "rpwithprior" in out and "non-private floor" in out and "on split seed 2" in out
    rows = pacsv.read_csv(tmp_path / "out" / "results.csv").to_pylist()
    assert len(rows) == 3 and {r["split_seed"] for r in rows} == {2}


def test_curves_needs_a_range_with_data(tmp_path, capsys):
    code = cli.main(["curves", "--data", "x.csv", "--label-column", "t", "--out", str(tmp_path)])
    assert code != 0 and "--range" in capsys.readouterr().err


def test_split_seed_picks_the_test_rows_and_the_validation_folds_stay_inside_its_training_rows(tmp_path, capsys):
    from rpwjax.experiments.curves import curves_split

    def split(**kw):
        return curves_split(dataset="crime", out_dir=tmp_path / "out", **kw)

    zero, one, again = split(), split(split_seed=1), split(split_seed=1)
    assert (zero.split_seed, one.split_seed) == (0, 1)
    np.testing.assert_array_equal(zero.test_index, train_test_split(load_dataset("crime"), seed=0).test_index)
    np.testing.assert_array_equal(one.test_index, again.test_index)
    np.testing.assert_array_equal(one.y_test, again.y_test)
    assert not np.array_equal(one.test_index, zero.test_index) and one.test_index.size == zero.test_index.size
    # a validation fold of split 1 holds out a quarter of split 1's training rows, never one of its test rows
    fold = split(split_seed=1, validation=True, validation_seed=11)
    assert fold.split_seed == 1 and np.intersect1d(fold.test_index, one.test_index).size == 0
    assert np.intersect1d(fold.train_index, one.test_index).size == 0
    assert np.array_equal(np.sort(np.concatenate([fold.train_index, fold.test_index])), one.train_index)
    # a bad value is refused before any data is read, naming the flag and the value
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(InputError, match=f"--split-seed must be an integer from 0 to .*, got --split-seed={bad!r}"):
            split(split_seed=bad)
    code = cli.main(["curves", "--dataset", "crime", "--split-seed", "-3", "--out", str(tmp_path / "refused")])
    err = capsys.readouterr().err
    assert code == 2 and "--split-seed=-3" in err and not (tmp_path / "refused").exists()
    code = cli.main(["curves", "--dataset", "crime", "--split-seed", "one", "--out", str(tmp_path / "refused")])
    assert code == 2 and "'one'" in capsys.readouterr().err


def test_bad_sweep_config():
    with pytest.raises(InputError, match="seeds=0"):
        SweepConfig(seeds=0).validate()
    with pytest.raises(InputError, match="first_seed=-1"):
        SweepConfig(first_seed=-1).validate()
    with pytest.raises(InputError, match="mechanism='magic'"):
        SweepConfig(mechanisms=("magic",)).validate()


@pytest.mark.long
@pytest.mark.slow
def test_variants_join_the_sweep_and_the_target_table_compares_them(crime_split):
    from rpwjax.experiments.sweeps import VARIANTS, format_target_table, target_table

    config = SweepConfig(mechanisms=("rr-on-bins",), variants=tuple(VARIANTS), epsilons=(1.0,), seeds=1, epochs=2)
    rows = run_sweep(crime_split, config, progress=False)
    names = {r["mechanism"] for r in rows}
    assert names == {"rr-on-bins", NON_PRIVATE, *VARIANTS}
    for r in rows:
        assert np.isfinite(r["test_mse"]) and np.isfinite(r["label_mse"])
    table = target_table(summarize(rows))
    (cell,) = table
    assert cell["baseline"] == "rr-on-bins" and cell["variant"] in VARIANTS
    best = min(r["test_mse"] for r in rows if r["mechanism"] in VARIANTS)
    assert cell["variant_mse"] == best and cell["met"] == (best < cell["baseline_mse"])
    assert "| crime | 1 |" in format_target_table(table)
    with pytest.raises(InputError, match="variant='magic'"):
        SweepConfig(variants=("magic",)).validate()


@pytest.mark.slow
def test_paper_config_and_debias_rows(crime_split):
    from rpwjax.experiments.sweeps import PAPER_CONFIG
    from rpwjax.posterior import debias

    config = SweepConfig(mechanisms=("rpwithprior",), configs=("default", "paper"), denoise=("debias",),
                         epsilons=(0.5, 2.0), seeds=1, epochs=1)
    rows = run_sweep(crime_split, config, progress=False)
    cells = {(r["mechanism"], r["config"], r["epsilon"]) for r in rows if r["mechanism"] != NON_PRIVATE}
    assert cells == {(m, c, e) for m, c in (("rpwithprior", "default"), ("rpwithprior", "paper"),
                                            ("rpwithprior+debias", "default")) for e in (0.5, 2.0)}
    assert {r["prior"] for r in rows} == {"private"}
    y, lo, hi = crime_split.y_train, crime_split.lo, crime_split.hi
    eps = np.array([0.5, 2.0])
    # the paper config: ζ = 0.4 capped at (A2 - A1)/2, objective inside, ε₁ = ε/3 on crime
    settings = config.fit_settings("crime", "rpwithprior", "paper", eps)
    paper = api.fit("rpwithprior", y, range=(lo, hi), epsilon=eps, seed=10_000, **settings)
    np.testing.assert_allclose(paper.epsilon_prior, eps / 3)
    half = 0.5 * (np.asarray(paper.params.a2) - np.asarray(paper.params.a1))
    np.testing.assert_allclose(paper.params.zeta, np.where((half > 0) & (half < 0.4), half, 0.4))
    assert paper.params.objective == "inside"
    noisy = privatize_grid(paper, 0, "rpwithprior", y)
    got = {r["epsilon"]: r["label_mse"] for r in rows if r["config"] == "paper"}
    np.testing.assert_array_equal([got[e] for e in eps], np.mean((noisy - y) ** 2, axis=1))
    # California: a fixed ε₁ = 0.017 and ζ = 0.7
    cal = config.fit_settings("california", "rpwithprior", "paper", eps)
    assert cal["prior_epsilon"] == 0.017 and cal["zeta"] == PAPER_CONFIG["california"]["zeta"] == 0.7
    # the debias rows: the default fit's release (the plain rows' labels), debiased
    fit = api.fit("rpwithprior", y, range=(lo, hi), epsilon=eps, seed=10_000,
                  **config.fit_settings("crime", "rpwithprior", "default", eps))
    clean = debias(fit.params, privatize_grid(fit, 0, "rpwithprior", y))
    got = {r["epsilon"]: r["label_mse"] for r in rows if r["mechanism"] == "rpwithprior+debias"}
    np.testing.assert_array_equal([got[e] for e in eps], np.mean((clean - y) ** 2, axis=1))
    # the summary keeps the configs apart, and so do the table and the target table
    summary = summarize(rows)
    assert len([s for s in summary if s["mechanism"] == "rpwithprior" and s["epsilon"] == 0.5]) == 2
    from rpwjax.experiments.sweeps import format_table, target_table

    text = format_table(summary)
    assert "rpwithprior [paper]" in text and "rpwithprior+debias" in text
    assert {t["baseline"] for t in target_table(summary)} <= {"rpwithprior", "rpwithprior [paper]"}


def test_paper_config_is_refused_where_it_is_not_defined(crime_split):
    with pytest.raises(InputError, match="rpwithprior only"):
        SweepConfig(mechanisms=("rpwithprior", "laplace"), configs=("paper",)).validate()
    with pytest.raises(InputError, match="config='magic'"):
        SweepConfig(configs=("magic",)).validate()
    with pytest.raises(InputError, match="denoise='magic'"):
        SweepConfig(denoise=("magic",)).validate()
    with pytest.raises(InputError, match="data sets california, crime"):
        SweepConfig(mechanisms=("rpwithprior",), configs=("paper",)).fit_settings("mine", "rpwithprior", "paper",
                                                                                   np.array([1.0]))


def test_settings_are_never_averaged_together_and_old_rows_read_as_the_default(tmp_path):
    from rpwjax.experiments.sweeps import format_table, format_target_table, target_table, write_rows
    from rpwjax.experiments.plots import plot_curves

    base = dict(dataset="crime", mechanism="rpwithprior", epsilon=1.0, seed=0, label_mse=0.1, fit_seconds=0.0,
                sample_seconds=0.0)
    rows = [dict(base, prior="private", config="default", test_mse=1.0, split_seed=0),
            dict(base, prior="private", config="paper", test_mse=2.0, split_seed=0),
            dict(base, prior="empirical", config="default", test_mse=4.0, split_seed=0),
            dict(base, seed=1, prior="private", config="default", test_mse=3.0, split_seed=0)]
    summary = summarize(rows)
    means = {(s["prior"], s["config"]): s["test_mse_mean"] for s in summary}
    assert means == {("private", "default"): 2.0, ("private", "paper"): 2.0, ("empirical", "default"): 4.0}
    old = [{k: v for k, v in r.items() if k not in ("prior", "config", "split_seed")} for r in rows[:1]]  # a committed CSV's row
    assert summarize(old)[0]["prior"] == "private" and summarize(old)[0]["config"] == "default"
    assert summarize(old)[0]["split_seed"] == 0
    text = format_table(summary)
    assert "crime (private prior)" in text and "crime (empirical prior)" in text and "rpwithprior [paper]" in text
    assert "on split seed 0" in text and "split seed 1" not in text
    paths = plot_curves(rows, tmp_path)
    assert sorted(p.name for p in paths) == ["crime_empirical_curves.png", "crime_private_curves.png"]
    before_splits = [{k: v for k, v in r.items() if k != "split_seed"} for r in rows[:1]]
    write_rows(rows + before_splits, tmp_path / "results.csv")  # a row read from a CSV before the column: split 0
    back = pacsv.read_csv(tmp_path / "results.csv").to_pylist()
    assert [(r["prior"], r["config"], r["split_seed"]) for r in back] == [
        (r["prior"], r["config"], 0) for r in rows + before_splits]
    # rows of another train/test split are never averaged with split 0's: their own table, target rows and plot
    other = [dict(base, prior="private", config="default", test_mse=9.0, split_seed=2),
             dict(base, mechanism="auto", prior="private", config="default", test_mse=8.0, split_seed=2)]
    summary = summarize(rows + other)
    assert {(s["split_seed"], s["test_mse_mean"]) for s in summary if s["mechanism"] == "rpwithprior"
            and s["config"] == "default" and s["prior"] == "private"} == {(0, 2.0), (2, 9.0)}
    text = format_table(summary)
    assert "on split seed 0" in text and "crime (private prior): test MSE (mean ± std over seeds) on split seed 2" in text
    [t] = target_table(summary)
    assert (t["split_seed"], t["baseline_mse"], t["variant_mse"]) == (2, 9.0, 8.0)
    assert "| crime, split seed 2 | 1 |" in format_target_table([t])
    paths = plot_curves(rows + other, tmp_path / "splits")
    assert sorted(p.name for p in paths) == ["crime_empirical_split0_curves.png", "crime_private_split0_curves.png",
                                             "crime_private_split2_curves.png"]


@pytest.mark.slow
def test_curves_cli_known_prior_paper_config_and_debias(tmp_path, capsys):
    code = cli.main(["curves", "--dataset", "crime", "--mechanisms", "rpwithprior", "--config", "default", "paper",
                     "--denoise", "debias", "--prior", "empirical", "--epsilon", "1", "--seeds", "1", "--epochs", "1",
                     "--out", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = pacsv.read_csv(tmp_path / "results.csv").to_pylist()
    assert {(r["mechanism"], r["prior"], r["config"]) for r in rows} == {
        ("rpwithprior", "empirical", "default"), ("rpwithprior", "empirical", "paper"),
        ("rpwithprior+debias", "empirical", "default"), (NON_PRIVATE, "empirical", "default")}
    assert "crime (empirical prior)" in out and "rpwithprior [paper]" in out


def _small_csv(path):
    """200 rows of two features and a label in [0, 1]: a sweep on it takes a few seconds."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 2))
    y = np.clip(0.5 + 0.2 * x[:, 0] + 0.1 * rng.normal(size=200), 0, 1)
    path.write_text("a,b,y\n" + "".join(f"{a:.4f},{b:.4f},{v:.4f}\n" for (a, b), v in zip(x, y)))
    return path


def test_curves_overwrite_removes_the_earlier_plots_it_does_not_draw_again(tmp_path, capsys):
    """--overwrite over an earlier sweep leaves this sweep's results only: an earlier plot under another name
    goes (in the same commit as the new files), a file the program never names stays."""
    data = _small_csv(tmp_path / "in.csv")
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "results.csv").write_bytes(b"old results\n")
    (out / "other_curves.png").write_bytes(b"old plot of another data set")
    (out / "in_curves.png").write_bytes(b"old plot")
    (out / "notes.txt").write_bytes(b"mine\n")
    code = cli.main(["curves", "--data", str(data), "--label-column", "y", "--range", "0", "1", "--mechanisms",
                     "laplace", "--epsilon", "1", "--seeds", "1", "--epochs", "1", "--quiet", "--out", str(out),
                     "--overwrite"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert sorted(p.name for p in out.iterdir()) == ["in_curves.png", "notes.txt", "results.csv"]
    assert (out / "in_curves.png").read_bytes().startswith(b"\x89PNG")
    assert (out / "notes.txt").read_bytes() == b"mine\n"
    assert "other_curves.png" not in captured.out


def test_plot_curves_keeps_the_earlier_plots_when_it_fails_or_is_not_asked_to_replace(tiny_sweep, tmp_path,
                                                                                      monkeypatch):
    from matplotlib.figure import Figure

    from rpwjax.errors import InputError
    from rpwjax.experiments.plots import plot_curves

    out = tmp_path / "plots"
    out.mkdir()
    (out / "other_curves.png").write_bytes(b"old plot")
    # without replace an earlier plot of another name is left alone
    assert plot_curves(tiny_sweep, out) == [out / "crime_curves.png"]
    assert sorted(p.name for p in out.iterdir()) == ["crime_curves.png", "other_curves.png"]
    (out / "crime_curves.png").write_bytes(b"old crime plot")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # a failure while drawing (after the plot's file was written) removes nothing
    real = Figure.savefig

    def broken(self, fname, *args, **kwargs):
        real(self, fname, *args, **kwargs)
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(RuntimeError, match="plotting failed"):
        plot_curves(tiny_sweep, out, csv_path=out / "results.csv", replace=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # a failure in the commit itself, after the new files are in place and other_curves.png was moved aside
    # (the next earlier plot, zz_curves.png, is a key file, which is never removed), puts everything back
    monkeypatch.setattr(Figure, "savefig", real)
    (out / "zz_curves.png").write_bytes(bytes(range(32)).hex().encode() + b"\n")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(InputError, match="key file"):
        plot_curves(tiny_sweep, out, csv_path=out / "results.csv", replace=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_every_reproduce_job_replaces_the_committed_files(tmp_path):
    """`rpwjax reproduce` regenerates the committed sweeps in place (its help says it replaces its files there),
    so every job's `curves` command line carries --overwrite: without it each job stopped at the first
    results.csv already in plots/."""
    from rpwjax.experiments.reproduce import JOBS

    parser = cli.build_parser()
    for job in JOBS:
        args = parser.parse_args(job.argv(tmp_path))
        assert args.command == "curves" and args.overwrite is True, job.name


def test_a_users_table_far_from_zero_trains_on_labels_scaled_by_the_public_range(tmp_path):
    """A user's labels on [2000, 2020] (years): the networks learn them mapped from the public range onto
    [0, 1] and the test MSE is given back in the labels' units, so the non-private floor beats the range's
    midpoint and the sweep tells the mechanisms apart (on raw labels every row sat near 4e6)."""
    import pyarrow.parquet as pq

    from rpwjax.experiments.datasets import load_table

    rng = np.random.default_rng(3)
    x = rng.normal(size=1000)
    y = np.clip(2010 + 3 * x + rng.normal(size=1000), 2000, 2020)
    pq.write_table(pa.table({"x": x, "y": y}), tmp_path / "years.parquet")
    split = train_test_split(load_table(tmp_path / "years.parquet", "y", 2000, 2020))
    config = SweepConfig(mechanisms=("laplace",), epsilons=(8.0,), seeds=1, epochs=20)
    rows = {r["mechanism"]: r["test_mse"] for r in run_sweep(split, config, progress=False)}
    midpoint = float(np.mean((split.y_test - 2010) ** 2))
    assert rows[NON_PRIVATE] < 0.3 * midpoint, (rows, midpoint)
    assert rows["laplace"] < 0.5 * midpoint, (rows, midpoint)


@pytest.mark.parametrize("options, message", [
    (dict(epsilons=(1.0, 1.0)), "--epsilon names 1.0 twice"),
    (dict(mechanisms=("laplace", "laplace")), "--mechanisms names 'laplace' twice"),
    (dict(prior="empirical", prior_epsilon=0.1), "--prior-epsilon 0.1 does nothing under --prior empirical"),
    (dict(first_seed=2**63 - 1), r"first_seed \(--first-seed\) must be an integer from 0 to 2147483645"),
    (dict(epochs=0), r"epochs \(--epochs\) must be an integer >= 1"),
])
def test_a_sweep_refuses_options_that_would_duplicate_rows_or_do_nothing(options, message):
    """A value given twice would write its rows twice (the summaries would count the copies as seeds); an option
    that does nothing is refused, as fit and privatize refuse it."""
    with pytest.raises(InputError, match=message):
        SweepConfig(**options).validate()


def test_a_data_tables_options_are_checked_before_it_is_read(tmp_path, capsys):
    """Options are checked before the table is read (a missing file is not even looked at), and --config paper,
    the paper's setting for its bundled sets, is refused for a --data table."""
    for options, message in ((["--epochs", "0"], "--epochs"), (["--config", "paper"], "not for a --data table")):
        code = cli.main(["curves", "--data", str(tmp_path / "missing.csv"), "--label-column", "y", "--range", "0",
                         "1", "--mechanisms", "rpwithprior", "--epsilon", "1", "--seeds", "1", "--quiet",
                         "--out", str(tmp_path / "out"), *options])
        err = capsys.readouterr().err
        assert code == 2 and message in err and "missing.csv" not in err, err


def test_an_output_folder_that_cannot_be_made_is_refused_before_any_work(tmp_path, capsys):
    """--out under a file (or an unwritable folder) is refused before the data is read, naming the folder."""
    (tmp_path / "plain").write_text("not a folder")
    code = cli.main(["curves", "--dataset", "crime", "--mechanisms", "laplace", "--epsilon", "1", "--seeds", "1",
                     "--epochs", "1", "--quiet", "--out", str(tmp_path / "plain" / "sweep")])
    err = capsys.readouterr().err
    assert code == 2 and "is not a folder" in err and "plain" in err, err
