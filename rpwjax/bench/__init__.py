r"""Runtime benchmarks: ``rpwjax bench [--quick] --out DIR``.

One table of cases serves both runners: the package's own timing loop (the
``rpwjax bench`` command, :func:`rpwjax.bench.report.run_plan`, which writes
``DIR/results.json`` and plots) and the pytest-benchmark suite in
``benchmarks/`` (which wraps the same cases with the ``benchmark`` fixture). A
case is a :class:`~rpwjax.bench.cases.Member` of a
:class:`~rpwjax.bench.cases.Group`; a group is one (family, size) point, and
its members are timed *interleaved* (repeat r of every member, then repeat
r + 1, ...) so that a case and its baseline see the same machine state. Every
ratio is ``median(case) / median(baseline)`` from the same group of the same
run.

Families and what they measure (sizes per plan in :data:`PLANS`):

* ``sampling`` (size: labels n): the release path
  (:func:`rpwjax.release_path.release`: float64, grid, clamp, hash-derived block
  keys, host array in and out) for every registered mechanism, against the
  floor ``jax.random.uniform`` of n float64 values on the device (a one-draw
  sampler cannot beat it).
* ``search-labels`` (size: labels): the exact interval search
  (``fit_rpwithprior`` with a fixed ζ, one ε) on an empirical prior of
  continuous labels (every label distinct) and of Criteo-shaped zero-inflated
  labels.
* ``search-histogram`` (size: bins k): the same search on a k-bin histogram
  prior, both objectives, next to the paper's O(k³) loop
  (:mod:`rpwjax.mechanisms.reference_algorithm1`) on the ``"inside"`` objective.
* ``search-epsilons`` (size: number of ε): the fixed-ζ fit vmapped over an ε
  grid, on one large continuous prior.
* ``fit-support`` (size: support points k): ``fit_rr_on_bins`` and
  ``fit_unbiased`` (whole public fit, one ε).
* ``privatize`` (size: rows): ``privatize_file``'s streaming half,
  ``release_file`` (RPWithPrior fitted in setup, Parquet in and out, no
  progress bar) against a plain pyarrow copy of the same file
  (``ParquetFile.iter_batches`` + ``ParquetWriter``, same chunk size).
* ``privatize-table`` (size: rows): ``privatize_table(..., pipeline="auto")``
  (what ``rpwjax privatize-table --pipeline auto`` runs: read, every private
  statistic and fit, release, write) at ε = 1 on a generated table of 8
  float64 features whose label in [0, 10] follows a fixed public formula,
  against ``release_file`` (RPWithPrior, fitted in setup as in ``privatize``)
  of the same label column, range and ε. The auto record's ``meta`` carries
  the rule's choice (branch, release, Q).

Timing: a warm-up call (compiles; reported as ``warmup_s``), a calibration
call that sets how many calls make one sample (at least ``min_sample_s``),
then ``repeats`` samples; the median is reported. Every timed call ends in
``block_until_ready`` (or returns host data). Numbers are wall-clock seconds
(``time.perf_counter``) on whatever backend JAX runs on, recorded with the
machine's load average: on a busy machine they are upper bounds.
"""


from rpwjax.bench.plans import FAMILIES, PLANS, TARGETS, Plan

# the cases (:mod:`rpwjax.bench.cases`) and the timing loop and report (:mod:`rpwjax.bench.report`, matplotlib)
# are imported from their modules: ``rpwjax --help`` reads the plans only
__all__ = ["FAMILIES", "PLANS", "Plan", "TARGETS"]
