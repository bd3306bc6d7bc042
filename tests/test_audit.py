"""rpwjax audit: every registered mechanism passes; deliberately broken ones are caught."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from rpwjax import cli
from rpwjax.audit import checks as audit_module
from rpwjax.audit import empirical, exact
from rpwjax.audit import shipped as shipped_checks
from rpwjax import realized
from rpwjax.mechanisms.additive import Laplace, Staircase, gaussian_delta
from rpwjax.api import mechanism_names
from rpwjax.audit.checks import audit_mechanism, fit_example
from rpwjax.audit.empirical import clopper_pearson
from rpwjax.errors import InputError
from rpwjax.mechanisms.rpwithprior import RPWithPrior
from rpwjax.mechanisms.rr_on_bins import RROnBins
from helpers import run, slow_unless

SAMPLES = 200_000  # per label; enough to catch every broken mechanism below with a wide margin
# the tests about the fresh labels, and those marked long, keep the shipped count; the others draw fewer
SHIPPED_FRESH = {"test_a_sampler_that_leaks_in_a_narrow_interval_is_caught_by_the_fresh_labels",
                 "test_audit_seed_reproduces_the_labels_and_is_reported"}


@pytest.fixture(autouse=True)
def _fewer_fresh_labels(request):
    """Audits here draw conftest's FEWER_FRESH_LABELS fresh labels, except in SHIPPED_FRESH and long tests."""
    if request.node.originalname not in SHIPPED_FRESH and request.node.get_closest_marker("long") is None:
        request.getfixturevalue("fewer_fresh_labels")


# mechanisms known to spend their whole budget on the pair (lo, hi): the audit must come close to ε on them
TIGHT = {"laplace", "staircase", "rpwithprior", "rr-on-bins"}


# --------------------------------------------------------------------------- broken mechanisms


class StaircaseOuterBranchBroken(Staircase):
    r"""Claims the staircase density, but its sampler picks the outer sub-interval w.p. b/(1+b).

    The correct probability is (1-γ)b/(γ + (1-γ)b): the bug ignores γ's weighting.
    With P(G = k) = (1-b)b^k and a random sign, the sampled noise density is

        inner_k = (1-b) b^k / (2Δγ(1+b)),   outer_k = (1-b) b^{k+1} / (2Δ(1-γ)(1+b)),

    so inner_k / outer_k = e^ε (1-γ)/γ. A label shift of Δ maps ỹ ∈ [lo, lo + γΔ)
    from inner_0 of y = lo onto outer_0 of y = hi (γ < 1/2), so the true privacy loss
    is ε + log((1-γ)/γ) > ε: 1.336 at ε = 1 (γ* = 0.41674). The other ratios are
    e^{±ε} (same piece, next step) and ((1-γ)/γ)^{±1} (outer_k vs inner_{k+1}), smaller.
    """

    def sample_from_uniform(self, u, y):
        # the honest one-uniform inverse CDF, except that within a step the outer part gets mass b/(1+b)
        y = jnp.asarray(y)
        eps, gamma, width = (jnp.asarray(v, y.dtype) for v in (self.epsilon, self.gamma, self.hi - self.lo))
        w = jnp.where(u < 0.5, 2 * u, 2 * (1 - u))
        step = jnp.floor(-jnp.log(w) / eps)
        b = jnp.exp(-eps)
        c = jnp.clip((1 - w * jnp.exp(eps * step)) / (1 - b), 0.0, 1.0)
        inner_share = 1 / (1 + b)  # the bug: should be γ / (γ + (1-γ) b)
        z = jnp.where(c < inner_share, gamma * c / inner_share, gamma + (1 - gamma) * (c - inner_share) / (1 - inner_share))
        magnitude = width * (step + z)
        return jnp.clip(y, self.lo, self.hi) + jnp.where(u < 0.5, -magnitude, magnitude)


class RPWithPriorOuterTwoEpsilon(RPWithPrior):
    """Claims ε, but density and sampler use e^{-2ε} on the outer pieces (and the matching γ).

    It is exactly RPWithPrior at 2ε: window / outer = e^{2ε}, so the log ratio is 2ε.
    """

    def _honest(self):
        return RPWithPrior(2 * self.epsilon, self.zeta, self.a1, self.a2, self.lo, self.hi, self.objective)

    def log_density(self, y_tilde, y):
        return self._honest().log_density(y_tilde, y)

    def sample_from_uniform(self, u, y):
        return self._honest().sample_from_uniform(u, y)


class WindowOnly(RPWithPrior):
    """Uniform on [y' - ζ, y' + ζ] only: the support moves with the label (no privacy at all)."""

    def log_density(self, y_tilde, y):
        y_tilde = jnp.asarray(y_tilde)
        inside = jnp.abs(y_tilde - self.projected(jnp.asarray(y, y_tilde.dtype))) <= self.zeta
        return jnp.where(inside, -jnp.log(2 * jnp.asarray(self.zeta, y_tilde.dtype)), -jnp.inf)

    def sample_from_uniform(self, u, y):
        y = jnp.asarray(y)
        return self.projected(y) + (2 * u - 1) * jnp.asarray(self.zeta, y.dtype)


class RROnBinsSamplerTwoEpsilon(RROnBins):
    """Claims the ε pmf, but samples the own output w.p. e^{2ε}/(e^{2ε} + m - 1): log loss 2ε for m = 2."""

    def sample_from_uniform(self, u, y):
        honest = RROnBins(2 * self.epsilon, self.outputs, self.thresholds, self.num_bins, self.lo, self.hi)
        return honest.sample_from_uniform(u, y)


def halved_laplace(epsilon):
    """Laplace with scale Δ/(2ε) on [0, 1] while claiming ε: its log ratio is 2ε."""
    return Laplace(np.float64(epsilon), np.float64(1.0 / (2 * epsilon)), 0.0, 1.0)


# --------------------------------------------------------------------------- every mechanism passes


@pytest.mark.parametrize("name, epsilon", slow_unless(
    [(name, eps) for name in mechanism_names() for eps in (1.0, 2.0)], fast=[("laplace", 1.0)],
    ids=[f"{name}-{eps}" for name in mechanism_names() for eps in (1.0, 2.0)]))
def test_registered_mechanism_passes(name, epsilon):
    params = fit_example(name, epsilon)  # a mechanism that fails to import or fit fails here, never skipped
    report = audit_mechanism(params, samples=SAMPLES, name=name)
    assert report.exact_pass, report.details["exact"]
    assert report.realized_pass, report.details["realized"]
    assert report.empirical_pass, report.details["empirical"]
    assert report.output_grid_pass, report.details["output_grid"]
    # the grid and the clamp cost (or save) less than 0.1% of the label MSE
    assert abs(report.details["realized"]["release_mse_change"]) < 1e-3
    assert report.empirical_lower_bound <= epsilon
    if report.pure:
        assert report.exact_max_log_ratio <= epsilon + 1e-9
        assert report.realized_max_log_ratio <= epsilon + 1e-6
        assert report.delta == 0.0
        if name in TIGHT:
            # the exact check is not vacuous (the maximum is attained) ...
            assert report.exact_max_log_ratio >= epsilon - 1e-6
            # ... and the sampler is audited with power: the lower bound comes close to ε
            assert report.empirical_lower_bound >= 0.85 * epsilon
    else:
        assert report.delta > 0
        assert report.exact_delta <= report.delta * (1 + 1e-5)
        assert report.realized_delta <= report.delta
        if name == "gaussian":
            width = params.hi - params.lo
            closed_form = gaussian_delta(params.sigma, epsilon, width)
            assert report.exact_delta == pytest.approx(closed_form, rel=1e-5)


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("name, epsilon", [(name, eps) for name in mechanism_names() for eps in (1.0, 2.0)],
                         ids=[f"{name}-{eps}" for name in mechanism_names() for eps in (1.0, 2.0)])
def test_registered_mechanism_passes_with_the_shipped_fresh_labels(name, epsilon):
    """The realized check as ``rpwjax audit`` runs it, with audit_module.FRESH_LABELS fresh labels (the audits
    of test_registered_mechanism_passes draw fewer: conftest's fewer_fresh_labels)."""
    params = fit_example(name, epsilon)
    report = audit_mechanism(params, samples=SAMPLES, name=name)
    assert report.details["realized"]["fresh_labels"] == shipped_checks.FRESH_LABELS
    assert report.realized_pass, report.details["realized"]
    assert report.passed


# --------------------------------------------------------------------------- broken mechanisms are caught


def test_laplace_with_half_the_scale_is_caught():
    report = audit_mechanism(halved_laplace(1.0), samples=SAMPLES)
    assert report.exact_max_log_ratio == pytest.approx(2.0, abs=1e-9)
    assert not report.exact_pass
    assert report.empirical_lower_bound > 1.0
    assert not report.empirical_pass
    assert not report.passed


@pytest.mark.slow
def test_staircase_with_wrong_sampler_branch_is_caught():
    honest = fit_example("staircase", 1.0)
    broken = StaircaseOuterBranchBroken(honest.epsilon, honest.gamma, honest.lo, honest.hi, honest.gamma_rule)
    true_loss = 1.0 + np.log((1 - honest.gamma) / honest.gamma)
    assert true_loss > 1.3
    report = audit_mechanism(broken, samples=SAMPLES)
    assert report.exact_pass  # its claimed density is the honest one: only sampling can tell
    assert not report.empirical_pass
    assert 1.0 < report.empirical_lower_bound <= true_loss


@pytest.mark.slow
def test_rpwithprior_with_doubled_outer_epsilon_is_caught():
    honest = fit_example("rpwithprior", 1.0)
    broken = RPWithPriorOuterTwoEpsilon(
        honest.epsilon, honest.zeta, honest.a1, honest.a2, honest.lo, honest.hi, honest.objective
    )
    report = audit_mechanism(broken, samples=SAMPLES)
    assert report.exact_max_log_ratio == pytest.approx(2.0, abs=1e-9)
    assert not report.exact_pass
    assert report.empirical_lower_bound > 1.0
    assert not report.empirical_pass


@pytest.mark.slow
def test_rr_on_bins_with_wrong_sampler_is_caught():
    honest = fit_example("rr-on-bins", 1.0)
    assert int(honest.num_bins) >= 2
    broken = RROnBinsSamplerTwoEpsilon(
        honest.epsilon, honest.outputs, honest.thresholds, honest.num_bins, honest.lo, honest.hi
    )
    report = audit_mechanism(broken, samples=SAMPLES)
    assert report.exact_pass  # the claimed pmf is honest
    assert not report.empirical_pass
    assert report.empirical_lower_bound > 1.0


@pytest.mark.slow
def test_label_dependent_support_is_caught():
    honest = fit_example("rpwithprior", 1.0)
    broken = WindowOnly(honest.epsilon, honest.zeta, honest.a1, honest.a2, honest.lo, honest.hi, honest.objective)
    report = audit_mechanism(broken, samples=20_000, grid_size=4001)
    assert report.exact_max_log_ratio == np.inf
    assert not report.exact_pass
    assert any("support depends on the label" in p for p in report.details["exact"]["problems"])
    assert not report.empirical_pass


# --------------------------------------------------------------------------- statistics


def test_clopper_pearson_bounds():
    n, alpha = 1000, 1e-3
    lower, upper = clopper_pearson(np.array([0, 500, 1000]), n, alpha)
    assert lower[0] == 0.0 and upper[2] == 1.0
    assert upper[0] == pytest.approx(1 - alpha ** (1 / n), rel=1e-9)  # k = 0: P(X = 0) = (1 - p)^n = α
    assert lower[2] == pytest.approx(alpha ** (1 / n), rel=1e-9)
    # the defining tail probabilities: P(X >= k | lower) = α and P(X <= k | upper) = α
    assert stats.binom.sf(499, n, lower[1]) == pytest.approx(alpha, rel=1e-6)
    assert stats.binom.cdf(500, n, upper[1]) == pytest.approx(alpha, rel=1e-6)


# --------------------------------------------------------------------------- command line and arguments


def audit_cli(argv):
    """``rpwjax audit ARGV`` through the command line's parser, errors raised (not printed)."""
    args = cli.build_parser().parse_args(["audit", *argv])
    return args.func(args)


@pytest.mark.slow
def test_cli_passes_and_prints_table(capsys):
    assert audit_cli(["--mechanism", "laplace", "--samples", "20000"]) == 0
    out = capsys.readouterr().out
    assert "laplace" in out and "claimed eps" in out and "NO" not in out


@pytest.mark.slow
def test_cli_fails_on_broken_mechanism(monkeypatch, capsys):
    monkeypatch.setattr(audit_module, "fit_example", lambda name, epsilon: halved_laplace(epsilon))
    assert audit_cli(["--mechanism", "laplace", "--epsilon", "1", "--samples", "20000"]) == 1
    assert "NO" in capsys.readouterr().out


def test_cli_reports_a_mechanism_that_cannot_be_fitted(monkeypatch, capsys):
    def fail(name, epsilon):
        raise RuntimeError("no such solver")

    monkeypatch.setattr(audit_module, "fit_example", fail)
    assert audit_cli(["--mechanism", "laplace", "--samples", "100"]) == 1
    assert "laplace at epsilon=1: could not be audited: RuntimeError: no such solver" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--mechanism", "laplace", "--epsilon", "100"], "laplace: epsilon=100 on the range [0, 1] cannot be certified for "
                                                      "a float64 release: epsilon above 20.1"),
    # one ε of several refused stops the run before any is audited
    (["--mechanism", "staircase", "--epsilon", "1", "30"], "staircase: epsilon=30 on the range [0, 1] cannot be "
                                                            "certified"),
])
def test_cli_refuses_an_epsilon_no_release_can_have_as_bad_input(capsys, argv, message):
    """privatize refuses such an ε with exit 2; audit did not audit it either, but said so on stdout with exit 1 as
    if the mechanism were broken: now it is bad input, one line on stderr, exit 2, nothing on stdout."""
    code, out, err = run(["audit", *argv, "--samples", "1000"], capsys)
    assert code == 2 and out == "", (out, err)
    assert err.startswith(f"rpwjax audit: error: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--epsilon", "0"], "epsilon=0.0"),
        (["--epsilon", "-1"], "epsilon=-1.0"),
        (["--epsilon", "nan"], "epsilon=nan"),
        (["--samples", "0"], "samples=0"),
        (["--mechanism", "nope"], "mechanism='nope'"),
    ],
)
def test_cli_bad_arguments(argv, named):
    with pytest.raises(InputError, match=named):
        audit_cli(argv)


def test_audit_mechanism_bad_arguments():
    params = halved_laplace(1.0)
    with pytest.raises(InputError, match="samples=0"):
        audit_mechanism(params, samples=0)
    with pytest.raises(InputError, match="batch shape"):
        audit_mechanism(Laplace(np.array([1.0, 2.0]), np.array([1.0, 0.5]), 0.0, 1.0))
    with pytest.raises(InputError, match="epsilon=0.0"):
        audit_module.audit("laplace", epsilon=0.0)
    with pytest.raises(InputError, match="samples=-5"):
        audit_module.audit("laplace", samples=-5)


@pytest.mark.slow
def test_output_grid_check_catches_unsnapped_outputs(monkeypatch):
    """If the release path stopped snapping to the public grid, the audit must fail."""
    params = audit_module.fit_example("laplace", 1.0)
    ok = audit_module.audit_mechanism(params, samples=20_000)
    assert ok.output_grid_pass and ok.details["output_grid"]["off_grid"] == 0

    def unsnapped(p, secret, labels, start=0):
        with jax.enable_x64(True):
            return np.asarray(p.sample(jax.random.key(int(secret.stream_key("test")[0])),
                                       jnp.asarray(labels, jnp.float64)))

    monkeypatch.setattr(shipped_checks, "release", unsnapped)  # the output-grid check's release
    monkeypatch.setattr(empirical, "release", unsnapped)  # and the empirical audit's
    bad = audit_module.audit_mechanism(params, samples=20_000)
    assert not bad.output_grid_pass and not bad.passed
    assert bad.details["output_grid"]["off_grid"] > 90_000


# --------------------------------------------------------------------------- as implemented: realized probabilities


def float32_release(params, grid):
    """The old pipelines' release: float32 uniforms (2^23 of them), float32 arithmetic, snapped to ``grid``."""

    def value_fn(k, y):
        u = ((k.astype(jnp.float32) + 0.5) * 2.0**-23).astype(jnp.float32)
        x = params.sample_from_uniform(u, jnp.asarray(y, jnp.float32)).astype(jnp.float64)
        return jnp.round(x / grid) * grid

    return value_fn, 1 << 23


@pytest.mark.slow
def test_realized_check_catches_a_float32_release():
    # range [0, 1], eps = 1, zeta = 0.1, labels 0.3 and 0.31: the float32 outputs of one label are not all
    # reachable from the other, whatever the fine grid 2^-24 does, so no finite epsilon holds
    params = RPWithPrior(np.float64(1.0), np.float64(0.1), np.float64(0.0), np.float64(1.0), 0.0, 1.0)
    labels = np.array([0.3, 0.31])
    value_fn, count = float32_release(params, 2.0**-24)
    counts = realized.realized_counts(value_fn, count, labels)
    below = counts["cells"] < 0.3
    impossible = (counts["counts"][0] > 0) & (counts["counts"][1] == 0) & below
    share = counts["counts"][0][impossible].sum() / counts["counts"][0][below].sum()
    assert share > 0.1  # a large share of the outputs under 0.3 cannot occur under 0.31
    assert realized.max_log_ratio(counts["counts"]) == np.inf
    report = realized.check(params, labels=labels, value_fn=value_fn, count=count)
    assert not report["pass"] and report["realized_max_log_ratio"] == np.inf
    # the shipped release of the same parameters is private as implemented, at the same labels and more
    shipped = realized.check(params)
    assert shipped["pass"], shipped["problems"]
    assert 1.0 - 1e-9 <= shipped["realized_max_log_ratio"] <= 1.0 + 1e-6


class LaplaceWideClamp(Laplace):
    """The shipped sampler, clamped far beyond where 2^52 uniforms resolve the tail (60 scales)."""

    def release_spec(self):
        spec = super().release_spec()
        h, margin = spec["grid"], 60 * float(self.scale)
        return {"grid": h, "low": np.ceil((self.lo - margin) / h) * h, "high": np.floor((self.hi + margin) / h) * h}


def test_realized_check_catches_a_clamp_beyond_the_resolution_of_the_uniform():
    honest = fit_example("laplace", 1.0)
    assert realized.check(honest)["pass"]
    wide = LaplaceWideClamp(honest.epsilon, honest.scale, honest.lo, honest.hi)
    report = realized.check(wide)
    assert not report["pass"] and report["realized_max_log_ratio"] == np.inf


@pytest.mark.parametrize("name", ["laplace", "staircase"])
def test_realized_ratio_is_within_a_thousandth_of_a_small_epsilon(name, monkeypatch):
    """Below ε = 1e-3 the certificate allows min(1e-6, 1e-3·ε), not an absolute 1e-6, and the release grid
    holds enough uniforms per cell (rpwjax.grid.cell_count) to meet it: at ε = 1e-7 the realized ratio is
    within 0.1% of ε. With cells of 2^23 uniforms at every ε, the same release realizes about 2.15e-7,
    twice ε, and the check refuses it."""
    from rpwjax import grid
    from rpwjax.mechanisms import additive

    epsilon = 1e-7
    params = fit_example(name, epsilon)
    report = realized.check(params)
    assert report["pass"], report["problems"]
    assert epsilon - 1e-15 <= report["realized_max_log_ratio"] <= epsilon * (1 + grid.RELATIVE_TOLERANCE)
    assert float(realized.tolerance(epsilon)) == pytest.approx(1e-10, rel=1e-12)
    assert float(realized.tolerance(2.0)) == 1e-6
    monkeypatch.setattr(additive, "cell_count", lambda eps, pure=True: float(grid.MIN_CELL_COUNT))
    coarse = realized.check(params)
    assert not coarse["pass"] and coarse["realized_max_log_ratio"] > 1.5 * epsilon
    assert any(p.startswith("realized max log ratio") and "exceeds epsilon=1e-07 + 1e-10" in p
               for p in coarse["problems"])


def test_realized_check_catches_a_sampler_that_is_not_monotone():
    class Shuffled(Laplace):
        def sample_from_uniform(self, u, y):
            return super().sample_from_uniform(jnp.mod(u + 0.5, 1.0), y)

    honest = fit_example("laplace", 1.0)
    report = realized.check(Shuffled(honest.epsilon, honest.scale, honest.lo, honest.hi))
    assert not report["pass"]
    assert any("not monotone" in p for p in report["problems"])


def test_key_space_check_catches_a_32_bit_key():
    assert realized.key_space_check()["pass"]

    def integer_seed(material, block):  # the old path: an integer seed through jax.random.PRNGKey (32 bits kept)
        return np.asarray(jax.random.key_data(jax.random.PRNGKey(int.from_bytes(material, "big") % 2**62 + block)))

    report = realized.key_space_check(integer_seed)
    assert not report["pass"]
    assert any("do not reach the key" in p for p in report["problems"])


@pytest.mark.slow
def test_cli_json_one_object_per_mechanism_and_epsilon(capsys):
    import json

    code = audit_cli(["--mechanism", "staircase", "--epsilon", "0.5", "2", "--samples", "20000", "--json"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    assert [(r["mechanism"], r["epsilon"]) for r in lines] == [("staircase", 0.5), ("staircase", 2.0)]
    for r in lines:
        for field in ("mechanism", "epsilon", "delta", "exact_max_log_ratio", "realized_max_log_ratio", "pass"):
            assert field in r
        assert r["pass"] is True and r["key_check_pass"] is True
        assert r["epsilon"] - 1e-9 <= r["realized_max_log_ratio"] <= r["epsilon"] + 1e-6


@pytest.mark.slow
def test_cli_json_fails_on_broken_mechanism(monkeypatch, capsys):
    import json

    monkeypatch.setattr(audit_module, "fit_example", lambda name, epsilon: halved_laplace(epsilon))
    assert audit_cli(["--mechanism", "laplace", "--samples", "20000", "--json"]) == 1
    (line,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert line["pass"] is False and line["realized_max_log_ratio"] > 1.9


def test_two_step_edges_in_one_grid_cell_are_both_found():
    """A window edge a hair inside the support edge (y just above A1) lies in the same grid cell: both edges must
    be found, or the mass of that cell is wrong and an honest fit fails its exact check."""
    import jax

    from rpwjax.mechanisms.rpwithprior import RPWithPrior

    params = RPWithPrior(1.0, 0.1, 0.37512, 0.8, 0.0, 1.0)  # edges at A1 - ζ = 0.27512 and y - ζ = 0.27514
    with jax.enable_x64(True):
        out = exact.exact_check(params, np.array([0.0, 0.37514, 0.6, 1.0]), exact.DEFAULT_GRID_SIZE, 0)
    assert out["info"]["problems"] == []
    lo, hi = out["info"]["mass_range"]
    assert abs(lo - 1) < 1e-8 and abs(hi - 1) < 1e-8
    assert out["max_ratio"] == pytest.approx(1.0, abs=1e-9)


# --------------------------------------------------------------------------- fresh labels, every release certified


def leaky_laplace(monkeypatch, low=0.41, high=0.42):
    """Laplace whose sampler releases the label itself for labels in [low, high] (and is honest elsewhere)."""
    honest = Laplace.sample_from_uniform

    def leaky(self, u, y):
        x = honest(self, u, y)
        return jnp.where((y >= low) & (y <= high), jnp.asarray(y, x.dtype), x)

    monkeypatch.setattr(Laplace, "sample_from_uniform", leaky)


def test_a_sampler_that_leaks_in_a_narrow_interval_is_caught_by_the_fresh_labels(monkeypatch):
    params = fit_example("laplace", 1.0)
    leaky_laplace(monkeypatch)
    assert realized.check(params)["pass"]  # the fixed labels (ends, grid, breakpoints) miss [0.41, 0.42] ...
    report = audit_mechanism(params, samples=20_000, audit_seed=3)
    assert not report.realized_pass and not report.passed  # ... 4096 fresh labels do not
    assert report.details["realized"]["labels"] >= 4096 and report.details["audit_seed"] == 3


def test_audit_seed_reproduces_the_labels_and_is_reported(capsys):
    import json

    params = fit_example("laplace", 1.0)
    assert np.array_equal(realized.fresh_labels(params, 4096, 5), realized.fresh_labels(params, 4096, 5))
    lines = []
    for extra in (["--audit-seed", "5"], ["--audit-seed", "5"], []):
        assert audit_cli(["--mechanism", "rr-on-bins", "--samples", "2000", "--json", *extra]) == 0
        (line,) = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        lines.append(line)
    assert lines[0]["audit_seed"] == lines[1]["audit_seed"] == 5 and lines[0] == lines[1]
    assert isinstance(lines[2]["audit_seed"], int) and lines[2]["realized_labels"] >= 4096
    assert audit_cli(["--mechanism", "rr-on-bins", "--samples", "2000", "--audit-seed", "6"]) == 0
    assert "audit seed 6; --audit-seed 6 reproduces them" in capsys.readouterr().out


BIG_RANGE = (1e8, 1e8 + 1)  # float64 spacing 1.5e-8 there: a release that samples in absolute values loses ~1e-3 of ε


def _big_table(path, n=2000):
    import pandas as pd

    rng = np.random.default_rng(0)
    pd.DataFrame({"x": rng.normal(size=n), "x2": rng.normal(size=n),
                  "y": BIG_RANGE[0] + rng.uniform(0, 1, n)}).to_csv(path, index=False)
    return path


def _released_sets(monkeypatch):
    """Record every (params, spec) a release certifies; returns the list."""
    from rpwjax import certify

    from helpers import spy

    return spy(monkeypatch, certify, "certify", lambda args, kwargs: args)


def _assert_realized_within(params, output_spec):
    from rpwjax import certify
    from rpwjax.sampling import spec

    s = spec(params) if output_spec is None else output_spec
    rows = [(params, s)] if np.ndim(params.epsilon) == 0 else [
        certify._row(params, s, i) for i in np.unique(np.asarray(params.a1), return_index=True)[1][:4]]
    for p, ps in rows:
        ratio = realized.check(p, output_spec=ps)["realized_max_log_ratio"]
        assert ratio <= float(p.epsilon) + 1e-9, (ratio, float(p.epsilon))


def test_inline_privatize_on_a_range_far_from_zero_is_certified(tmp_path, capsys, monkeypatch):
    from rpwjax.api import load_params
    from rpwjax.io.atomic import read_json

    src = _big_table(tmp_path / "big.csv")
    out = tmp_path / "o.csv"
    code = cli.main(["privatize", str(src), "-o", str(out), "--label-column", "y", "--range", *map(str, BIG_RANGE),
                     "--mechanism", "rpwithprior", "--epsilon", "1", "--seed", "1", "--quiet"])
    if code != 0:  # refused is allowed, with one line naming what cannot be certified
        err = capsys.readouterr().err
        assert code == 2 and "cannot be certified" in err and not out.exists()
        return
    params, record = load_params(read_json(str(out) + ".json"))
    assert record["epsilon_mechanism"] == pytest.approx(0.9)
    _assert_realized_within(params, None)


@pytest.mark.parametrize("name, range_", slow_unless([("laplace", (0.0, 1.0)), ("rpwithprior", BIG_RANGE)],
                                                     fast=[("laplace", (0.0, 1.0))]))
def test_audit_accepts_a_privatize_sidecar(tmp_path, capsys, name, range_):
    import json

    src = _big_table(tmp_path / "t.csv") if range_ == BIG_RANGE else tmp_path / "t.csv"
    if range_ != BIG_RANGE:
        src.write_text("y\n" + "\n".join(str(v) for v in np.linspace(0, 1, 50)) + "\n")
    out = tmp_path / "o.csv"
    assert cli.main(["privatize", str(src), "-o", str(out), "--label-column", "y", "--range", *map(str, range_),
                     "--mechanism", name, "--epsilon", "1", "--seed", "1", "--quiet"]) == 0
    audit_cli(["--params", str(out) + ".json", "--samples", "2000", "--audit-seed", "1", "--json"])
    line = json.loads(capsys.readouterr().out)
    checks = line["verified"]["checks"]
    assert checks["fields"] and checks["prior"] and checks["parameters"] and checks["realized"], line
    assert line["realized_pass"] and line["audit_seed"] == 1
    if range_ != BIG_RANGE:  # (far from zero the exact check's quadrature of the ideal density is not exact enough)
        assert line["pass"], line


@pytest.mark.parametrize("pipeline", slow_unless(["auto", "linear-prior"], fast=["auto"]))
def test_pipeline_on_a_range_far_from_zero_releases_only_certified_parameters(tmp_path, capsys, monkeypatch,
                                                                                pipeline):
    seen = _released_sets(monkeypatch)
    src = _big_table(tmp_path / "big.csv")
    out = tmp_path / "o.csv"
    code = cli.main(["privatize-table", str(src), "-o", str(out), "--label-column", "y", "--range",
                     *map(str, BIG_RANGE), "--epsilon", "0.3", "--pipeline", pipeline, "--seed", "1"])
    if code != 0:
        assert code == 2 and "cannot be certified" in capsys.readouterr().err and not out.exists()
        return
    assert seen
    for params, *rest in seen:
        _assert_realized_within(params, rest[0] if rest else None)


@pytest.mark.parametrize("params", [
    RPWithPrior(np.float64(0.5), np.float64(0.3), np.float64(0.1), np.float64(0.9), 0.0, 1.0),
    RPWithPrior(np.float64(6.0), np.float64(0.05), np.float64(1.0), np.float64(3.0), 0.14999, 5.00001),
    RPWithPrior(np.float64(15.0), np.float64(0.05), np.float64(1.0), np.float64(3.0), 0.14999, 5.00001),
    Laplace(np.float64(1.0), np.float64(1.0), 0.0, 1.0),
], ids=["rpwithprior eps 0.5", "rpwithprior eps 6", "rpwithprior eps 15", "laplace eps 1"])
def test_thresholds_found_from_the_cdf_are_the_bisected_ones(params):
    """The realized check finds each cell's threshold near its guess from the mechanism's exact CDF and bisects
    the rest (what makes a certificate of many per-row parameter sets affordable at a large ε): the counts are
    those of the plain bisection, with the CDF's guesses, with guesses that are all wrong, and with guesses
    partly wrong; and the CDF's guesses find most thresholds (the speed-up rests on that)."""
    from rpwjax.sampling import spec

    s = spec(params)
    value_fn, count, cells = realized.shipped_value_fn(params, s)
    labels = realized.audit_labels(params)
    plain = realized.realized_counts(value_fn, count, labels, cells)["counts"]
    guess = realized.cdf_guess(params, s["grid"])
    truth = np.concatenate([np.zeros((labels.size, 1), np.int64), np.cumsum(plain, axis=1)[:, :-1]], axis=1)
    near = np.abs(guess(cells, labels) - truth) <= realized.GUESS_REACH
    assert near.mean() > 0.9, near.mean()
    rng = np.random.default_rng(5)
    wrong = lambda c, y: rng.integers(0, count, (y.size, c.size))  # noqa: E731
    half = lambda c, y: np.where(rng.random((y.size, c.size)) < 0.5, guess(c, y), 0)  # noqa: E731
    for g in (guess, wrong, half):
        np.testing.assert_array_equal(realized.realized_counts(value_fn, count, labels, cells, g)["counts"], plain)


def _linear_prior_on_levels(x, y, secret, levels):
    from rpwjax.pipelines import linear_prior

    out, record = linear_prior.linear_prior_labels(x, y, 0.0, 1.0, 30.0, secret=secret, levels=levels)
    assert record["per_label_epsilon"] == 30.0
    return out, 0  # sets certified besides the levels' (none)


def _two_stage_on_levels(x, y, secret, levels):
    from rpwjax.pipelines import two_stage

    config = two_stage.TwoStageConfig(stage1="rpwithprior", levels=levels)
    run = two_stage.two_stage_labels(x, y, 0.0, 1.0, 16.0, secret=secret, config=config, epochs=2)  # ε₂ 14.4
    assert run.record["per_label_epsilon"] == 16.0
    return run.labels, 1  # sets certified besides part B's levels': stage 1's


@pytest.mark.parametrize("pipeline", [_linear_prior_on_levels, _two_stage_on_levels],
                         ids=["linear-prior", "two-stage"])
def test_a_per_row_release_at_a_large_epsilon_certifies_one_set_per_level(pipeline, monkeypatch):
    """At a large ε (30; two-stage's ε₂ 14.4) no closed-form bound certifies RPWithPrior's per-row intervals, so
    every distinct parameter set gets the realized check: the per-row pipelines round their centres (linear-prior's model, two-stage's
    m1) to public levels, as auto does, so the checks are at most levels + 1 however many rows (with 8 levels
    here: 9 at most for 600 rows, and two-stage's stage-1 set), and the release still passes them."""
    from rpwjax import certify
    from rpwjax.keys import Secret

    checked = []
    original = certify._check_set
    monkeypatch.setattr(certify, "_check_set", lambda params, s: (checked.append(params), original(params, s))[1])
    monkeypatch.setattr(certify, "_results", {})
    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 3))
    y = np.clip(0.5 + 0.15 * x[:, 0] + 0.05 * rng.normal(size=600), 0.0, 1.0)
    out, besides = pipeline(x, y, Secret.from_seed(4), 8)
    assert out.shape == y.shape and np.all(np.isfinite(out))
    assert 2 <= len(checked) - besides <= 9, len(checked)
