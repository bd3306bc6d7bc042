"""Files, row numbers, exit codes and leftovers of ``rpwjax privatize``, ``fit`` and ``privatize-table``; bad labels
at the Python API's entry points.

Every case asserts the exit code (2: bad input, 1: I/O, 130/143: SIGINT/SIGTERM),
the one-line message (the problem and the value), the row (the 1-based data row
and, for CSV and text files, the physical line it starts on; the header is
line 1) and which files exist afterwards: a failed or interrupted run leaves
nothing new behind (no output, no sidecar, no temporary file, no directory it
created), and an existing output pair is left untouched.
"""

import contextlib
import csv
import errno
import io as pyio
import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rpwjax
from rpwjax import cli, ledger
from rpwjax.errors import InputError
from rpwjax.pipelines import PIPELINES
from helpers import fixed_key, run, slow_unless


def listing(directory):
    return sorted(p.name for p in Path(directory).iterdir())


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    d = tmp_path_factory.mktemp("shared")
    fixed_key(d / "key")
    np.savetxt(d / "train.txt", np.linspace(0, 1, 101))
    assert cli.main(["fit", "--labels", str(d / "train.txt"), "--range", "0", "1", "--mechanism", "rpwithprior",
                     "--epsilon", "1", "--key-file", str(d / "key"), "--save", str(d / "p.json")]) == 0
    return d


def minimal_csv(rows, newline="\n"):
    """The reference dialect: a field is quoted only if it holds a comma, a quote or a line break."""
    def field(f):
        return '"' + f.replace('"', '""') + '"' if any(c in f for c in ',"\r\n') else f
    return "".join(",".join(field(f) for f in row) + newline for row in rows)


def parse(data: bytes, encoding="utf-8"):
    return list(csv.reader(pyio.StringIO(data.decode(encoding), newline="")))


# --------------------------------------------------------------------------- the privatize table (CSV input)

INLINE = ["--mechanism", "rpwithprior", "--epsilon", "1", "--range", "0", "1"]
LAPLACE = ["--mechanism", "laplace", "--epsilon", "1", "--range", "0", "1"]
LATIN1 = b"id,name,y\n1,ok,0.5\n2,caf\xe9,0.5\n"

# (case, input bytes, options (a saved fit unless they fit inline), exit code, fragments of the one-line message)
PRIVATIZE_CASES = [
    ("duplicate label column", b"id,y,y\n1,0.5,0.5\n", None, 2,
     ["label column 'y' appears 2 times in the header", "columns 2, 3"]),
    ("Latin-1 file read as UTF-8", LATIN1, None, 2,
     ["is not valid utf-8: byte 0xe9 in column 'name' at data row 2 (line 3)", "--encoding"]),
    ("Latin-1 label read as UTF-8", b"id,y\n1,0.5\n2,0.5\xe9\n", None, 2,
     ["is not valid utf-8: byte 0xe9 in column 'y' at data row 2 (line 3)"]),
    ("Latin-1 header read as UTF-8", b"id,caf\xe9,y\n1,2,0.5\n", None, 2,
     ["is not valid utf-8: byte 0xe9 in header field 2 at the header (line 1)"]),
    ("Latin-1 file read as ASCII", LATIN1, ["--encoding", "ascii"], 2,
     ["is not valid ascii: byte 0xe9 in column 'name' at data row 2 (line 3)"]),
    ("unknown encoding", LATIN1, ["--encoding", "klingon"], 2, ["unknown encoding 'klingon'"]),
    ("ragged row, too few fields", b"id,name,y\n1,a,0.5\n2,b\n3,c,0.5\n", None, 2,
     ["data row 2 (line 3)", "has 2 fields, the header has 3"]),
    ("ragged row, too many fields", b"id,y\n1,0.5\n2,0.5,extra\n", None, 2,
     ["data row 2 (line 3)", "has 3 fields, the header has 2"]),
    ("ragged row after a quoted line break", b'id,note,y\n1,"two\nlines",0.5\n2,x\n', None, 2,
     ["data row 2 (line 4)", "has 2 fields, the header has 3"]),
    ("quote that never closes", b'id,note,y\n1,"open,0.5\n2,x,0.5\n', None, 2,
     ["data row 1 (line 2)", "has 2 fields", "closing quote missing"]),
    ("ragged row after a quote inside an unquoted field", b'id,height,y\n1,5\'11",0.5\n2,6\'\n3,6",0.5\n', None, 2,
     ["data row 2 (line 3)", "has 2 fields, the header has 3"]),
    ("Latin-1 in a quoted field read as UTF-8", b'"id","name","y"\n"1","ok",0.5\n"2","caf\xe9",0.5\n', None, 2,
     ["is not valid utf-8: byte 0xe9 in column 'name' at data row 2 (line 3)"]),
    ("Latin-1 in a later chunk read as UTF-8", LATIN1, ["--chunk-rows", "1"], 2,
     ["is not valid utf-8: byte 0xe9 in column 'name' at data row 2 (line 3)"]),
    ("quoted text label", b'"id","y"\n"1","0.5"\n"2","high"\n', None, 2,
     ["label 'high' in column 'y' is not a number, at data row 2 (line 3)"]),
    ("hex label", b"id,y\n1,0.5\n2,0x1A\n", None, 2,
     ["label '0x1A' in column 'y' is not a number, at data row 2 (line 3)"]),
    ("text label", b"id,y\n1,0.5\n2,high\n", None, 2,
     ["label 'high' in column 'y' is not a number, at data row 2 (line 3)"]),
    ("missing label after quoted line breaks", b'id,note,y\n1,"a\nb",0.5\n2,"c\n\nd",\n', None, 2,
     ["missing label in column 'y' (an empty field) at data row 2 (line 4)"]),
    ("bad label after blank lines", b"id,y\n\n1,0.5\n\n\n2,oops\n", None, 2,
     ["label 'oops' in column 'y' is not a number, at data row 2 (line 6)"]),
    ("CRLF line ends", b"id,y\r\n1,0.5\r\n2,x\r\n", None, 2, ["label 'x'", "data row 2 (line 3)"]),
    ("NaN label", b"id,y\n1,0.5\n2,NaN\n", None, 2,
     ["label nan in column 'y' is not a finite number, at data row 2 (line 3)"]),
    ("infinite label", b"id,y\n1,-inf\n", None, 2, ["label -inf", "not a finite number, at data row 1 (line 2)"]),
    ("label outside the range", b"id,y\n1,0.5\n2,7\n", None, 2,
     ["label 7.0 in column 'y' lies outside the public range [0.0, 1.0], at data row 2 (line 3)", "--clip"]),
    ("header only", b"id,y\n", None, 2, ["has no rows"]),
    ("empty file", b"", None, 2, ["is empty"]),
    ("label column missing", b"id,x\n1,2\n", None, 2, ["label column 'y' not found", "['id', 'x']"]),
    ("row offset 2^64", b"id,y\n1,0.5\n", ["--row-offset", str(2**64)], 2,
     ["row_offset (--row-offset) must be an integer from 0 to 9223372036854775807", f"row_offset={2**64}"]),
    ("negative row offset", b"id,y\n1,0.5\n", ["--row-offset", "-1"], 2, ["row_offset (--row-offset) must be an integer from 0 to 9223372036854775807", "row_offset=-1"]),
    ("row offset + rows pass 2^63", b"id,y\n1,0.5\n2,0.5\n3,0.5\n", ["--row-offset", str(2**63 - 2)], 2,
     [f"{2**63 - 2} plus the rows", "passes the last global row index 2^63 - 1 at data row 3 (line 4)"]),
    ("chunk rows 0", b"id,y\n1,0.5\n", ["--chunk-rows", "0"], 2, ["chunk_rows (--chunk-rows) must be an integer from 1 to 4194304", "chunk_rows=0"]),
    ("chunk rows too many", b"id,y\n1,0.5\n", ["--chunk-rows", str(2**22 + 1)], 2, ["from 1 to 4194304", str(2**22 + 1)]),
    ("not an integer", b"id,y\n1,0.5\n", ["--chunk-rows", "ten"], 2,
     ["argument --chunk-rows: invalid int value: 'ten'"]),
    ("bins too many", b"id,y\n1,0.5\n", INLINE + ["--bins", "10000000"], 2,
     ["--bins must be an integer from 1 to 1024, got --bins=10000000"]),
    ("bins 0", b"id,y\n1,0.5\n", INLINE + ["--bins", "0"], 2, ["from 1 to 1024, got --bins=0"]),
    ("--prior-epsilon under an empirical prior", b"id,y\n1,0.5\n",
     INLINE + ["--prior", "empirical", "--prior-is-public", "--prior-epsilon", "0.1"], 2,
     ["--prior-epsilon 0.1 does nothing under --prior empirical"]),
    ("--bins under an empirical prior", b"id,y\n1,0.5\n",
     INLINE + ["--prior", "empirical", "--prior-is-public", "--bins", "8"], 2,
     ["--bins 8 does nothing under --prior empirical"]),
    ("--zeta for laplace", b"id,y\n1,0.5\n", LAPLACE + ["--zeta", "0.1"], 2,
     ["--zeta 0.1 does nothing for --mechanism laplace"]),
    ("--bins for laplace", b"id,y\n1,0.5\n", LAPLACE + ["--bins", "8"], 2,
     ["--bins 8 does nothing for --mechanism laplace"]),
    ("--delta for rpwithprior", b"id,y\n1,0.5\n", INLINE + ["--delta", "1e-6"], 2,
     ["--delta 1e-06 does nothing for --mechanism rpwithprior"]),
    ("--calibration for laplace", b"id,y\n1,0.5\n", LAPLACE + ["--calibration", "classic"], 2,
     ["--calibration classic does nothing for --mechanism laplace"]),
    ("--prior private for laplace", b"id,y\n1,0.5\n", LAPLACE + ["--prior", "private"], 2,
     ["--prior private does nothing for --mechanism laplace"]),
    ("--prior-epsilon for gaussian", b"id,y\n1,0.5\n", ["--mechanism", "gaussian", "--epsilon", "1", "--range", "0",
                                                        "1", "--prior-epsilon", "0.1"], 2,
     ["--prior-epsilon 0.1 does nothing for --mechanism gaussian"]),
    ("--bins with --params", b"id,y\n1,0.5\n", ["--bins", "8"], 2, ["--bins 8 does nothing with --params"]),
    ("--zeta with --params", b"id,y\n1,0.5\n", ["--zeta", "0.1"], 2, ["--zeta 0.1 does nothing with --params"]),
    ("--denoise debias for laplace", b"id,y\n1,0.5\n", LAPLACE + ["--denoise", "debias"], 2,
     ["--denoise debias applies to --mechanism rpwithprior only, got laplace", "already unbiased"]),
    ("--denoise debias for rr-on-bins", b"id,y\n1,0.5\n",
     ["--mechanism", "rr-on-bins", "--epsilon", "1", "--range", "0", "1", "--denoise", "debias"], 2,
     ["got rr-on-bins: it has no closed-form debiasing"]),
    ("--denoise debias for unbiased", b"id,y\n1,0.5\n",
     ["--mechanism", "unbiased", "--epsilon", "1", "--range", "0", "1", "--denoise", "debias"], 2,
     ["got unbiased: its release is unbiased for the label by construction"]),
    ("--prior-is-public with a private prior", b"id,y\n1,0.5\n", ["--prior-is-public"], 2,
     ["--prior-is-public does nothing here"]),
    ("--prior-is-public inline without --prior empirical", b"id,y\n1,0.5\n", INLINE + ["--prior-is-public"], 2,
     ["--prior-is-public does nothing without --prior empirical"]),
    ("inline fit: label outside the range", b"id,y\n1,0.5\n2,1.5\n", INLINE, 2,
     ["label 1.5 in column 'y' lies outside the public range [0.0, 1.0], at data row 2 (line 3)"]),
    ("inline fit: Latin-1 label", b"id,y\n1,0.5\xe9\n", INLINE, 2, ["not valid utf-8: byte 0xe9 in column 'y'"]),
    ("input is a directory", None, None, 2, ["input file", "in.csv' is a directory: give a file"]),
    # a refused or failed run creates no ledger either ({t}: the test's folder, where its ledger would be)
    ("--budget passed", b"id,y\n1,0.5\n", LAPLACE + ["--budget", "0.5"], 2,
     ["--budget 0.5: this release (epsilon 1) would take input", "nothing was written"]),
    ("inline laplace: bad label late", b"id,y\n1,0.5\n2,0.5\n3,oops\n", LAPLACE + ["--chunk-rows", "1"], 2,
     ["label 'oops' in column 'y' is not a number, at data row 3 (line 4)"]),
    ("--ledger that is a CSV", b"id,y\n1,0.5\n", LAPLACE + ["--ledger", "{t}/in.csv"], 2,
     ["ledger '{t}/in.csv' is not an rpwjax ledger: its first line is not a ledger record"]),
    # epsilon and range checked before the release's identity is built, and before any work
    ("epsilon nan", b"id,y\n1,0.5\n", ["--mechanism", "laplace", "--epsilon", "nan", "--range", "0", "1"], 2,
     ["epsilon must be positive and finite, got epsilon=nan"]),
    ("epsilon inf", b"id,y\n1,0.5\n", ["--mechanism", "laplace", "--epsilon", "inf", "--range", "0", "1"], 2,
     ["epsilon must be positive and finite, got epsilon=inf"]),
    # a number float64 cannot hold is named as typed, not as the inf or 0.0 it would read as
    ("epsilon 1e999", b"id,y\n1,0.5\n", ["--mechanism", "rpwithprior", "--epsilon", "1e999", "--range", "0", "1"],
     2, ["argument --epsilon: '1e999' lies outside float64's range (it would read as inf)"]),
    ("epsilon 1e400", b"id,y\n1,0.5\n", ["--mechanism", "laplace", "--epsilon", "1e400", "--range", "0", "1"], 2,
     ["argument --epsilon: '1e400' lies outside float64's range (it would read as inf)"]),
    ("epsilon 1e-400", b"id,y\n1,0.5\n", ["--mechanism", "laplace", "--epsilon", "1e-400", "--range", "0", "1"], 2,
     ["argument --epsilon: '1e-400' lies below float64's smallest positive number 5e-324 (it would read as 0.0)"]),
    ("range 0 1e400", b"id,y\n1,0.5\n", ["--mechanism", "laplace", "--epsilon", "1", "--range", "0", "1e400"], 2,
     ["argument --range: '1e400' lies outside float64's range"]),
    # the noise's variance overflows: one line, no NumPy "overflow encountered" warning before it
    ("laplace at epsilon 1e-320", b"id,y\n1,0.5\n", ["--mechanism", "laplace", "--epsilon", "1e-320", "--range",
                                                       "0", "4"], 2,
     ["laplace: epsilon=", "on the range [0, 4] cannot be certified", "epsilon is too small (below 1.14e-10"]),
    ("gaussian at epsilon 1e-320", b"id,y\n1,0.5\n", ["--mechanism", "gaussian", "--epsilon", "1e-320", "--range",
                                                        "0", "4"], 2,
     ["epsilon=1e-320 is too small for gaussian on a range of width 4.0"]),
    ("range 0 1e-320", b"id,y\n1,0\n", ["--mechanism", "laplace", "--epsilon", "1", "--range", "0", "1e-320"], 2,
     ["laplace: epsilon=1 on the range [0, 9.99", "e-321] cannot be certified for a float64 release: the range is too "
      "narrow for float64"]),
    # an option that takes one value (or LO HI) given twice: argparse would have kept the last
    ("--label-column given twice", b"id,y,a\n1,0.5,0.5\n", LAPLACE + ["--label-column", "a"], 2,
     ["argument --label-column: given twice (y and a): give it once"]),
    ("--epsilon given twice", b"id,y\n1,0.5\n", LAPLACE + ["--epsilon", "2"], 2,
     ["argument --epsilon: given twice (1 and 2): give it once"]),
    ("--mechanism given twice", b"id,y\n1,0.5\n", LAPLACE + ["--mechanism", "gaussian"], 2,
     ["argument --mechanism: given twice (laplace and gaussian): give it once"]),
    ("--range given twice", b"id,y\n1,0.5\n", LAPLACE + ["--range", "0", "4"], 2,
     ["argument --range: given twice (0 1 and 0 4): give it once"]),
    ("-o given twice", b"id,y\n1,0.5\n", LAPLACE + ["--output", "{t}/b.csv"], 2,
     ["argument -o/--output: given twice (", "o.csv and {t}/b.csv): give it once"]),
    ("--params given twice", b"id,y\n1,0.5\n", ["--params", "{t}/other.json"], 2,
     ["argument --params: given twice (", "p.json and {t}/other.json): give it once"]),
    ("rpwithprior at epsilon 1e-20", b"id,y\n1,0.5\n", ["--mechanism", "rpwithprior", "--epsilon", "1e-20",
                                                         "--range", "0", "1"], 2,
     ["epsilon is too small for the exact integer noise sampler of the private histogram", "got epsilon=1e-20",
      "the smallest accepted is 1.95e-16"]),
    ("rr-on-bins at prior epsilon 1e-20", b"id,y\n1,0.5\n",
     ["--mechanism", "rr-on-bins", "--epsilon", "1", "--prior-epsilon", "1e-20", "--range", "0", "1"], 2,
     ["prior_epsilon is too small for the exact integer noise sampler", "got prior_epsilon=1e-20",
      "the smallest accepted is 1.95e-17"]),
    ("laplace at epsilon 1e-300", b"id,y\n1,0.5\n", ["--mechanism", "laplace", "--epsilon", "1e-300", "--range",
                                                      "0", "1"], 2,
     ["laplace: epsilon=1e-300 on the range [0, 1] cannot be certified", "epsilon is too small (below 1.14e-10"]),
    # below 1.14e-10 no grid holds the realized ratio within 0.1% of ε: refused for every pure mechanism
    ("staircase at epsilon 1e-10", b"id,y\n1,0.5\n", ["--mechanism", "staircase", "--epsilon", "1e-10", "--range",
                                                        "0", "1"], 2,
     ["staircase: epsilon=1e-10 on the range [0, 1] cannot be certified for a float64 release: epsilon is too small "
      "(below 1.14e-10, holding the realized ratio within 0.1% of epsilon needs more than 2^46 of the 2^52 uniforms "
      "in every output cell)"]),
    ("range wider than float64", b"id,y\n1,0.5\n",
     ["--mechanism", "rpwithprior", "--epsilon", "1", "--range", "-1e308", "1e308"], 2,
     ["range is too wide: its width hi - lo is not finite in float64, got range=(-1e+308, 1e+308)"]),
] + [
    # what cannot be certified is refused, the same way at every ε above the limit (one line: no overflow warning)
    (f"{name} at epsilon 1000", b"id,y\n1,0.5\n2,0.25\n3,0.75\n",
     ["--mechanism", name, "--epsilon", "1000", "--range", "0", "1"], 2,
     [f"{name}: epsilon=", "on the range [0, 1] cannot be certified for a float64 release"])
    # (unbiased is absent: above its LP cap of 12 it is built at 12, which a float64 release certifies)
    for name in ("rpwithprior", "laplace", "gaussian", "staircase", "rr-on-bins")
]
# the fast subset: a saved fit refusing a bad file, an option refused inline, an inline fit refusing a label, a
# mechanism refused for --denoise debias
PRIVATIZE_FAST = ("Latin-1 file read as UTF-8", "--zeta for laplace", "inline fit: label outside the range",
                  "rpwithprior at epsilon 1000", "rr-on-bins at epsilon 1000", "input is a directory",
                  "--denoise debias for laplace", "--budget passed", "epsilon nan", "rpwithprior at epsilon 1e-20",
                  "--ledger that is a CSV", "epsilon 1e400", "epsilon 1e-400", "range 0 1e400",
                  "laplace at epsilon 1e-320", "gaussian at epsilon 1e-320", "staircase at epsilon 1e-10", "range 0 1e-320",
                  "--label-column given twice", "--epsilon given twice", "--mechanism given twice",
                  "--range given twice", "-o given twice", "--params given twice")


@pytest.mark.parametrize("case, content, options, code, fragments", slow_unless(
    PRIVATIZE_CASES, fast=[c for c in PRIVATIZE_CASES if c[0] in PRIVATIZE_FAST], ids=[c[0] for c in PRIVATIZE_CASES]))
def test_privatize_refuses_bad_input_with_one_line_and_leaves_nothing(shared, tmp_path, capsys, case, content,
                                                                       options, code, fragments):
    src = tmp_path / "in.csv"
    src.mkdir() if content is None else src.write_bytes(content)  # None: a directory where the input should be
    options = [o.format(t=tmp_path) for o in options or []]
    if "--mechanism" not in options:  # a saved fit unless the case fits inline
        options = ["--params", shared / "p.json", *options]
    if "--ledger" not in options:  # in the test's folder: a failed run must not create it
        options += ["--ledger", tmp_path / "ledger.jsonl"]
    out = tmp_path / "new" / "dir" / "o.csv"  # the run may create these directories: they must go again
    got, stdout, err = run(["privatize", src, "-o", out, "--label-column", "y", "--key-file", shared / "key",
                            "--quiet", *options], capsys)
    assert got == code, err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("rpwjax privatize: error: ") and "internal error" not in err
    for fragment in fragments:
        assert fragment.format(t=tmp_path) in err, (fragment, err)
    assert listing(tmp_path) == ["in.csv"]  # no output, no sidecar, no ledger, no temporary file, no new directory


def test_prior_options_of_a_prior_free_mechanism_count_when_it_denoises(shared, tmp_path, capsys):
    src = tmp_path / "in.csv"
    src.write_text("id,y\n" + "".join(f"{i},{(i % 10) / 10}\n" for i in range(200)))
    out = tmp_path / "o.csv"
    code, _, err = run(["privatize", src, "-o", out, "--label-column", "y", *LAPLACE, "--prior", "private", "--bins",
                        "8", "--prior-epsilon", "0.2", "--denoise", "posterior", "--quiet"], capsys)
    assert code == 0, err
    side = json.loads((tmp_path / "o.csv.json").read_text())
    assert side["prior"]["bins"] == 8 and side["epsilon_prior"] == 0.2


@pytest.mark.slow
def test_output_that_is_a_directory_writes_no_sidecar(shared, tmp_path, capsys):
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,y\n1,0.5\n")
    (tmp_path / "o.csv").mkdir()
    code, _, err = run(["privatize", src, "-o", tmp_path / "o.csv", "--label-column", "y", "--params",
                        shared / "p.json", "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1 and "output" in err and "o.csv' is a directory" in err
    assert listing(tmp_path) == ["in.csv", "o.csv"] and listing(tmp_path / "o.csv") == []


@pytest.mark.slow
def test_output_in_a_file_posing_as_a_directory_is_an_io_error(shared, tmp_path, capsys):
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,y\n1,0.5\n")
    (tmp_path / "file").write_text("x")
    code, _, err = run(["privatize", src, "-o", tmp_path / "file" / "sub" / "o.csv", "--label-column", "y",
                        "--params", shared / "p.json", "--quiet"], capsys)
    # refused before any work: the folder could not be made
    assert code == 2 and err.count("\n") == 1 and "internal error" not in err
    assert "cannot be written" in err and f"{str(tmp_path / 'file')!r} is not a folder" in err, err
    assert listing(tmp_path) == ["file", "in.csv"]


@pytest.mark.slow
def test_output_equal_to_the_input_and_a_missing_input(shared, tmp_path, capsys):
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,y\n1,0.5\n")
    code, _, err = run(["privatize", src, "-o", src, "--label-column", "y", "--params", shared / "p.json", "--quiet"],
                       capsys)
    assert code == 2 and err.count("\n") == 1 and "output must differ from input" in err
    assert src.read_bytes() == b"id,y\n1,0.5\n" and listing(tmp_path) == ["in.csv"]
    code, _, err = run(["privatize", tmp_path / "none.csv", "-o", tmp_path / "o.csv", "--label-column", "y",
                        "--params", shared / "p.json", "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1 and "input file not found" in err and "none.csv" in err
    assert listing(tmp_path) == ["in.csv"]


@pytest.mark.slow
def test_a_failed_run_leaves_an_existing_output_pair_untouched(shared, tmp_path, capsys):
    rows = "".join(f"{i},{(i % 10) / 10}\n" for i in range(5000))
    src = tmp_path / "in.csv"
    src.write_text("id,y\n" + rows + "5000,2.5\n")  # the last row is refused, after 5000 rows were written
    out = tmp_path / "o.csv"
    out.write_text("old output\n")
    (tmp_path / "o.csv.json").write_text('{"old": true}\n')
    code, _, err = run(["privatize", src, "-o", out, "--label-column", "y", "--params", shared / "p.json",
                        "--chunk-rows", "100", "--quiet", "--overwrite"], capsys)
    assert code == 2 and err.count("\n") == 1 and "label 2.5" in err and "data row 5001 (line 5002)" in err
    assert out.read_text() == "old output\n" and (tmp_path / "o.csv.json").read_text() == '{"old": true}\n'
    assert listing(tmp_path) == ["in.csv", "o.csv", "o.csv.json"]
    # a successful run replaces both
    src.write_text("id,y\n" + rows)
    code, _, err = run(["privatize", src, "-o", out, "--label-column", "y", "--params", shared / "p.json", "--quiet",
                        "--overwrite"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "o.csv.json").read_text())["rows"] == 5000
    assert listing(tmp_path) == ["in.csv", "o.csv", "o.csv.json"]


@pytest.mark.parametrize("number", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_names_the_output_and_leaves_nothing(shared, tmp_path, capsys, monkeypatch, number):
    from rpwjax.io import writers

    src = tmp_path / "in.csv"
    src.write_bytes(b"id,y\n1,0.5\n")
    real = writers.copy_with_labels

    def full(source, path, *args, **kwargs):  # the disk fills up while the output is written
        real(source, path, *args, **kwargs)
        raise OSError(number, os.strerror(number))

    monkeypatch.setattr(writers, "copy_with_labels", full)
    code, _, err = run(["privatize", src, "-o", tmp_path / "out" / "o.csv", "--label-column", "y", "--params",
                        shared / "p.json", "--quiet"], capsys)
    assert code == 1 and err.count("\n") == 1, err
    assert f"rpwjax privatize: error: cannot write '{tmp_path / 'out' / 'o.csv'}'" in err
    assert os.strerror(number) in err and ".part" not in err
    assert listing(tmp_path) == ["in.csv"]


def test_a_failed_sweep_leaves_nothing_new_and_an_earlier_sweep_as_it_was(tmp_path, capsys, monkeypatch):
    """results.csv and the plots of `rpwjax curves` (and `demo`) are renamed into place together at the end:
    plotting that fails after writing its file leaves no results.csv, plot, temporary file or folder."""
    from matplotlib.figure import Figure

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 2))
    y = np.clip(0.5 + 0.2 * x[:, 0] + 0.1 * rng.normal(size=200), 0, 1)
    (tmp_path / "in.csv").write_text("a,b,y\n" + "".join(f"{a:.4f},{b:.4f},{v:.4f}\n" for (a, b), v in zip(x, y)))
    sweep = ["curves", "--data", tmp_path / "in.csv", "--label-column", "y", "--range", "0", "1", "--mechanisms",
             "laplace", "--epsilon", "1", "--seeds", "1", "--epochs", "1", "--quiet"]
    real = Figure.savefig

    def broken(self, fname, *args, **kwargs):  # the plot's file is written, then plotting fails
        real(self, fname, *args, **kwargs)
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(Figure, "savefig", broken)
    # a new folder (and its parent): neither remains
    code, _, err = run([*sweep, "--out", tmp_path / "new" / "sweep"], capsys)
    assert code == 1 and err.count("\n") == 1 and "plotting failed" in err, err
    assert listing(tmp_path) == ["in.csv"]
    # over an earlier sweep with --overwrite: its results.csv and plot stay as they were, nothing is added
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.csv").write_bytes(b"old results\n")
    (tmp_path / "old" / "in_curves.png").write_bytes(b"old plot")
    code, _, err = run([*sweep, "--out", tmp_path / "old", "--overwrite"], capsys)
    assert code == 1 and "plotting failed" in err, err
    assert listing(tmp_path) == ["in.csv", "old"] and listing(tmp_path / "old") == ["in_curves.png", "results.csv"]
    assert (tmp_path / "old" / "results.csv").read_bytes() == b"old results\n"
    assert (tmp_path / "old" / "in_curves.png").read_bytes() == b"old plot"
    # a run that succeeds replaces both, and leaves no temporary file
    monkeypatch.setattr(Figure, "savefig", real)
    code, out, err = run([*sweep, "--out", tmp_path / "old", "--overwrite"], capsys)
    assert code == 0, err
    assert listing(tmp_path / "old") == ["in_curves.png", "results.csv"]
    assert (tmp_path / "old" / "results.csv").read_text().startswith('"dataset"')
    assert (tmp_path / "old" / "in_curves.png").read_bytes().startswith(b"\x89PNG")


# --------------------------------------------------------------------------- outputs that exist

KEY_TEXT = bytes(range(7, 39)).hex().encode() + b"\n"  # what `rpwjax keygen` writes
SAVED = ["--label-column", "y", "--params", "{s}/p.json", "--quiet"]
TABLE = ["--label-column", "y", "--range", "0", "1", "--epsilon", "1"]
FIT = ["--labels", "{t}/in.csv", "--label-column", "y", "--range", "0", "1", "--mechanism", "laplace", "--epsilon", "1"]
# (case, command line ({t}: the test's folder, {s}: the saved fit's), files there before, fragments of the message).
# The input's second label lies outside the range: had any work started, the message would be about that label.
EXISTING_CASES = [
    ("privatize over an unrelated file", ["privatize", "{t}/in.csv", "-o", "{t}/important.csv", *SAVED],
     {"important.csv": b"keep me\n"}, ["output '{t}/important.csv' already exists: give --overwrite to replace it"]),
    ("privatize over a key file, with --overwrite", ["privatize", "{t}/in.csv", "-o", "{t}/secret.csv", *SAVED,
                                                      "--overwrite"],
     {"secret.csv": KEY_TEXT}, ["refusing to overwrite '{t}/secret.csv': it is a key file", "with or without"]),
    ("privatize sidecar over an unrelated file", ["privatize", "{t}/in.csv", "-o", "{t}/o.csv", *SAVED],
     {"o.csv.json": b'{"mine": true}\n'}, ["output '{t}/o.csv.json' already exists"]),
    ("privatize sidecar over a key file, with --overwrite", ["privatize", "{t}/in.csv", "-o", "{t}/o.csv", *SAVED,
                                                              "--overwrite"],
     {"o.csv.json": KEY_TEXT}, ["refusing to overwrite '{t}/o.csv.json': it is a key file"]),
    ("privatize sidecar over its own params file, with --overwrite",
     ["privatize", "{t}/in.csv", "-o", "{t}/o.csv", "--label-column", "y", "--params", "{t}/o.csv.json", "--overwrite"],
     {"o.csv.json": None}, ["output must differ from input", "'{t}/o.csv.json'"]),
    ("inline privatize over an unrelated file", ["privatize", "{t}/in.csv", "-o", "{t}/o.csv", "--label-column", "y",
                                                 *INLINE], {"o.csv": b"old\n"}, ["output '{t}/o.csv' already exists"]),
    ("fit --save over a key file, with --overwrite", ["fit", *FIT, "--save", "{t}/secret.key", "--overwrite"],
     {"secret.key": KEY_TEXT}, ["refusing to overwrite '{t}/secret.key': it is a key file"]),
    ("fit --save over a key file with CRLF", ["fit", *FIT, "--save", "{t}/secret.key", "--overwrite"],
     {"secret.key": KEY_TEXT[:-1] + b"\r\n"}, ["'{t}/secret.key': it is a key file"]),
    ("fit --save over a file", ["fit", *FIT, "--save", "{t}/p.json"], {"p.json": b"{}\n"},
     ["output '{t}/p.json' already exists: give --overwrite"]),
    ("privatize-table over a file", ["privatize-table", "{t}/in.csv", "-o", "{t}/o.csv", *TABLE],
     {"o.csv": b"old\n"}, ["output '{t}/o.csv' already exists"]),
    ("privatize-table sidecar over a key file, with --overwrite",
     ["privatize-table", "{t}/in.csv", "-o", "{t}/o.csv", *TABLE, "--overwrite"], {"o.csv.json": KEY_TEXT},
     ["'{t}/o.csv.json': it is a key file"]),
    ("curves over an earlier sweep", ["curves", "--data", "{t}/in.csv", "--label-column", "y", "--range", "0", "1",
                                      "--out", "{t}/sweep"], {"sweep/results.csv": b"old\n"},
     ["output '{t}/sweep/results.csv' already exists"]),
    ("curves over an earlier sweep's plot", ["curves", "--data", "{t}/in.csv", "--label-column", "y", "--range", "0",
                                             "1", "--out", "{t}/sweep"], {"sweep/in_curves.png": b"png"},
     ["output '{t}/sweep/in_curves.png' already exists"]),
    ("curves over its own --data, with --overwrite",
     ["curves", "--data", "{t}/sweep/results.csv", "--label-column", "y", "--range", "0", "1", "--out", "{t}/sweep",
      "--overwrite"], {"sweep/results.csv": b"id,y\n1,0.5\n2,7\n"},
     ["output must differ from input", "'{t}/sweep/results.csv'"]),
    ("bench over an earlier run", ["bench", "--quick", "--out", "{t}/bench", "--cache", "{t}/cache"],
     {"bench/results.json": b"{}\n"}, ["output '{t}/bench/results.json' already exists"]),
    ("bench with a file as its --cache", ["bench", "--quick", "--out", "{t}/bench", "--cache", "{t}/in.csv"],
     {}, ["--cache '{t}/in.csv' is a file: give a directory"]),
    ("keygen into a directory", ["keygen", "-o", "{t}/keys"], {"keys/notes.txt": b"mine\n"},
     ["key file '{t}/keys' is a directory: give a file name"]),
    ("reproduce --report-only on a folder without sweeps", ["reproduce", "--report-only", "--out", "{t}/plots"],
     {"plots/notes.txt": b"mine\n"}, ["--out '{t}/plots' holds no committed sweeps"]),
]


@pytest.mark.parametrize("case, argv, existing, fragments", EXISTING_CASES, ids=[c[0] for c in EXISTING_CASES])
def test_nothing_is_overwritten_unless_asked_and_a_key_file_never(shared, tmp_path, capsys, case, argv, existing,
                                                                   fragments):
    (tmp_path / "in.csv").write_bytes(b"id,y\n1,0.5\n2,7\n")
    for name, content in existing.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes((shared / "p.json").read_bytes() if content is None else content)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    command = argv[0]
    code, _, err = run([a.format(t=tmp_path, s=shared) for a in argv], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"rpwjax {command}: error: "), err
    for fragment in fragments:
        assert fragment.format(t=tmp_path) in err, (fragment, err)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # untouched, nothing new


def test_the_library_never_replaces_a_key_file_either(tmp_path):
    from rpwjax import InputError
    from rpwjax.io.atomic import write_json

    key = tmp_path / "k.json"
    key.write_bytes(KEY_TEXT)
    with pytest.raises(InputError, match="it is a key file"):
        write_json(key, {"params": 1})
    assert key.read_bytes() == KEY_TEXT and listing(tmp_path) == ["k.json"]


def test_overwrite_replaces_an_existing_output_pair(shared, tmp_path, capsys):
    (tmp_path / "in.csv").write_bytes(b"id,y\n1,0.5\n2,0.25\n")
    (tmp_path / "o.csv").write_text("old output\n")
    (tmp_path / "o.csv.json").write_text('{"old": true}\n')
    code, _, err = run(["privatize", tmp_path / "in.csv", "-o", tmp_path / "o.csv", "--label-column", "y",
                        "--params", shared / "p.json", "--quiet", "--overwrite"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "o.csv.json").read_text())["rows"] == 2
    assert (tmp_path / "o.csv").read_text().startswith("id,y\n")
    assert listing(tmp_path) == ["in.csv", "o.csv", "o.csv.json"]


# --------------------------------------------------------------------------- Parquet input

def _parquet(path, y, **extra):
    pq.write_table(pa.table({"id": np.arange(len(y)), **extra, "y": y}), path)
    return path


PARQUET_CASES = [
    ("missing label", pa.array([0.1, 0.2, None, 0.4], pa.float64()), [],
     ["missing label in column 'y' at data row 3 of"]),
    ("NaN label", pa.array([0.1, float("nan")], pa.float64()), [],
     ["label nan", "not a finite number, at data row 2 of"]),
    ("label outside the range", pa.array([0.1, 0.2, 3.0]), [],
     ["label 3.0", "outside the public range", "data row 3 of"]),
    ("text labels", pa.array(["0.1", "0.2"]), [], ["label column 'y'", "must be numeric, got type string"]),
    ("--encoding with Parquet", pa.array([0.1]), ["--encoding", "latin-1"], ["--encoding applies to CSV and text"]),
    ("late chunk", pa.array(list(np.linspace(0, 1, 2500)) + [-1.0]), ["--chunk-rows", "1000"],
     ["label -1.0", "at data row 2501 of"]),
]


@pytest.mark.parametrize("case, labels, options, fragments", slow_unless(PARQUET_CASES, fast=PARQUET_CASES[:1],
                                                                        ids=[c[0] for c in PARQUET_CASES]))
def test_parquet_bad_input(shared, tmp_path, capsys, case, labels, options, fragments):
    src = _parquet(tmp_path / "in.parquet", labels)
    code, _, err = run(["privatize", src, "-o", tmp_path / "o.parquet", "--label-column", "y", "--params",
                        shared / "p.json", "--quiet", *options], capsys)
    assert code == 2 and err.count("\n") == 1 and "internal error" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert listing(tmp_path) == ["in.parquet"]


@pytest.mark.slow
def test_a_file_that_is_not_parquet(shared, tmp_path, capsys):
    (tmp_path / "in.parquet").write_bytes(b"id,y\n1,0.5\n")
    code, _, err = run(["privatize", tmp_path / "in.parquet", "-o", tmp_path / "o.parquet", "--label-column", "y",
                        "--params", shared / "p.json", "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1 and "could not read" in err and "as Parquet" in err
    assert listing(tmp_path) == ["in.parquet"]


def _privatize(src, tmp_path, shared, capsys, *options):
    """``rpwjax privatize SRC`` into the test's folder: (exit code, stderr)."""
    code, _, err = run(["privatize", src, "-o", tmp_path / "o.csv", "--label-column", "y", "--key-file",
                        shared / "key", "--ledger", tmp_path / "ledger.jsonl", "--quiet", *options], capsys)
    assert err.count("\n") == 1 and err.startswith("rpwjax privatize: error: "), err
    return code, err


def test_a_label_beyond_float64_is_named_as_written(shared, tmp_path, capsys):
    """1e400 parses as inf: the message names the text of the file, not the parsed value; an explicit inf keeps
    its own message."""
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,y\n1,0.5\n2,1e400\n3,0.5\n")
    code, err = _privatize(src, tmp_path, shared, capsys, *LAPLACE)
    assert code == 2
    assert "label '1e400' in column 'y' lies outside float64's range" in err and "label inf" not in err, err
    assert f"at data row 2 (line 3) of {str(src)!r}" in err
    src.write_bytes(b"id,y\n1,0.5\n2,-1E400\n")
    code, err = _privatize(src, tmp_path, shared, capsys, *LAPLACE, "--clip")
    assert code == 2 and "label '-1E400'" in err and "data row 2 (line 3)" in err, err
    src.write_bytes(b"id,y\n1,0.5\n2,-Infinity\n3,1e400\n")  # the first bad row is named, as written
    code, err = _privatize(src, tmp_path, shared, capsys, *LAPLACE)
    assert code == 2 and "label -inf in column 'y' is not a finite number, at data row 2 (line 3)" in err, err
    assert listing(tmp_path) == ["in.csv"]


def test_a_params_file_without_params_is_named(shared, tmp_path, capsys):
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,y\n1,0.5\n")
    record = json.loads((shared / "p.json").read_text())
    del record["params"]
    params = tmp_path / "no-params.json"
    params.write_text(json.dumps(record))
    code, err = _privatize(src, tmp_path, shared, capsys, "--params", params)
    assert code == 2 and f"params file {str(params)!r} is not an rpwjax fit record" in err, err
    assert listing(tmp_path) == ["in.csv", "no-params.json"]


@pytest.mark.parametrize("field, value, fragment", [
    ("mechanism", "foo", "mechanism must be one of rpwithprior, laplace, gaussian, staircase, rr-on-bins, unbiased, "
                         "got mechanism='foo'"),
    ("zeta", "a", "params.zeta must be a number or a list of numbers, got params.zeta='a'"),
    ("A1", None, "params.A1 must be a number or a list of numbers, got params.A1=None"),
    ("epsilon", [1, "x"], "params.epsilon must be a number or a list of numbers, got params.epsilon=[1, 'x']"),
])
def test_a_params_file_with_a_bad_field_is_named(shared, tmp_path, capsys, field, value, fragment):
    """privatize and audit name the params file, the field and its value (not a NumPy type error)."""
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,y\n1,0.5\n")
    record = json.loads((shared / "p.json").read_text())
    (record if field == "mechanism" else record["params"])[field] = value
    params = tmp_path / "bad.json"
    params.write_text(json.dumps(record))
    code, err = _privatize(src, tmp_path, shared, capsys, "--params", params)
    assert code == 2 and f"params file {str(params)!r}: {fragment}" in err and "ufunc" not in err, err
    if field == "mechanism":  # audit refuses it the same way, as bad input (the fields are audited as problems)
        code, out, err = run(["audit", "--params", params], capsys)
        assert code == 2 and out == "" and err == f"rpwjax audit: error: params file {str(params)!r}: {fragment}\n"
    assert listing(tmp_path) == ["bad.json", "in.csv"]


def test_numpy_floating_point_warnings_are_held_until_the_command_has_no_error(capsys):
    """A NumPy overflow on the way to a named error (e.g. epsilon 1e-320) would be a second line before the error's
    one: such warnings are held, and printed only after a command that returns; any other warning prints at once."""
    held = []
    show = cli._show_warning("privatize", held)
    show(RuntimeWarning("overflow encountered in divide"), RuntimeWarning, "f.py", 1)
    show(UserWarning("reproducible seed: not for production"), UserWarning, "f.py", 2)
    assert held == ["rpwjax privatize: warning: overflow encountered in divide"]
    assert capsys.readouterr().err == "rpwjax privatize: warning: reproducible seed: not for production\n"


def test_utf16_without_a_byte_order_mark_names_the_file_and_the_encoding(shared, tmp_path, capsys):
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,y\n1,0.5\n")  # ASCII: UTF-16 needs a byte order mark to tell its byte order
    code, err = _privatize(src, tmp_path, shared, capsys, *LAPLACE, "--encoding", "utf-16")
    assert code == 2 and f"input file {str(src)!r} cannot be read as utf-16" in err and "BOM" in err, err
    assert listing(tmp_path) == ["in.csv"]
    # with the mark the same file reads
    src.write_bytes("id,y\n1,0.5\n".encode("utf-16"))
    code, _, err = run(["privatize", src, "-o", tmp_path / "o.csv", "--label-column", "y", "--key-file",
                        shared / "key", "--ledger", tmp_path / "ledger.jsonl", "--quiet", *LAPLACE, "--encoding",
                        "utf-16"], capsys)
    assert code == 0, err


# --------------------------------------------------------------------------- labels of curves --data and --explain

CURVES = ["--range", "0", "1", "--mechanisms", "laplace", "--epsilon", "1", "--seeds", "1", "--epochs", "1", "--quiet"]


def _labels_table(path, labels):
    """A table with two features and ``labels`` (text for a CSV, a pyarrow array for Parquet) as column y."""
    if path.suffix == ".parquet":
        pq.write_table(pa.table({"a": np.arange(len(labels)), "b": np.arange(len(labels)) % 3, "y": labels}), path)
    else:
        path.write_text("a,b,y\n" + "".join(f"{i},{i % 3},{v}\n" for i, v in enumerate(labels)))
    return path


# (case, file name, labels, fragments of the message ({f}: the file's path as a Python string)); the same rows
# and words as `rpwjax privatize` uses for these inputs
CURVES_LABEL_CASES = [
    ("empty label cell", "in.csv", ["0.5", "", "0.25"] + ["0.5"] * 20,
     ["missing label in column 'y' (an empty field) at data row 2 (line 3) of {f}"]),
    ("text label", "in.csv", ["0.5", "0.25", "high"] + ["0.5"] * 20,
     ["label 'high' in column 'y' is not a number, at data row 3 (line 4) of {f}"]),
    ("label outside the range", "in.csv", ["2.1257"] + ["0.5"] * 22,
     ["label 2.1257 in column 'y' lies outside the public range [0.0, 1.0], at data row 1 (line 2) of {f}",
      "--clip"]),
    ("label beyond float64", "in.csv", ["0.5", "1e400"] + ["0.5"] * 21,
     ["label '1e400' in column 'y' lies outside float64's range (it would read as inf), at data row 2 (line 3) "
      "of {f}"]),
    ("Parquet null", "in.parquet", pa.array([0.5, None] + [0.5] * 21), ["missing label in column 'y' at data row 2 "
                                                                        "of {f}"]),
    ("Parquet NaN", "in.parquet", pa.array([0.5, 0.5, float("nan")] + [0.5] * 20),
     ["label nan in column 'y' is not a finite number, at data row 3 of {f}"]),
    ("Parquet text labels", "in.parquet", pa.array(["0.5"] * 23), ["label column 'y' of {f} must be numeric, got "
                                                                   "type string"]),
]


@pytest.mark.parametrize("case, name, labels, fragments", CURVES_LABEL_CASES, ids=[c[0] for c in CURVES_LABEL_CASES])
def test_curves_label_errors_name_the_file_the_row_and_the_value(tmp_path, capsys, case, name, labels, fragments):
    src = _labels_table(tmp_path / name, labels)
    code, out, err = run(["curves", "--data", src, "--label-column", "y", *CURVES, "--out", tmp_path / "sweep"],
                         capsys)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("rpwjax curves: error: "), err
    for fragment in fragments:
        assert fragment.format(f=repr(str(src))) in err, (fragment, err)
    assert "y[" not in err  # no 0-based index of the label array
    assert listing(tmp_path) == [name]


def test_privatize_table_explain_names_a_text_label_as_privatize_does(tmp_path, capsys):
    """--explain reads the label column's type only, through read_feature_table: a CSV label that is not a number
    is named as written, with its data row, line and file."""
    src = _labels_table(tmp_path / "in.csv", ["0.5", "high", "0.25"])
    code, out, err = run(["privatize-table", src, "--label-column", "y", "--range", "0", "1", "--epsilon", "1",
                          "--explain"], capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert f"label 'high' in column 'y' is not a number, at data row 2 (line 3) of {str(src)!r}" in err
    src = _labels_table(tmp_path / "in.parquet", pa.array(["0.5", "x"]))
    code, _, err = run(["privatize-table", src, "--label-column", "y", "--range", "0", "1", "--epsilon", "1",
                        "--explain"], capsys)
    assert code == 2 and f"label column 'y' of {str(src)!r} must be numeric, got type string" in err, err


def test_curves_refuses_features_with_exclude(tmp_path, capsys):
    src = _labels_table(tmp_path / "in.csv", ["0.5"] * 23)
    code, _, err = run(["curves", "--data", src, "--label-column", "y", *CURVES, "--features", "a", "--exclude", "b",
                        "--out", tmp_path / "sweep"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "rpwjax curves: error: --exclude b does nothing with --features a: --features uses exactly the columns it " \
           "names (give one of the two)" in err
    assert listing(tmp_path) == ["in.csv"]


# --------------------------------------------------------------------------- fit and privatize-table

FIT_CASES = [
    ("duplicate label column", "t.csv", b"id,y,y\n1,0.5,0.5\n", ["--label-column", "y"],
     ["label column 'y' appears 2 times"]),
    ("text label file, bad line after blank lines", "l.txt", b"0.5\n\n0.25\n\nabc\n", [],
     ["label 'abc'", "is not a number, at data row 3 (line 5)"]),
    ("text label file, two numbers on a line", "l.txt", b"0.5\n0.1,0.2\n", [],
     ["label '0.1,0.2'", "data row 2 (line 2)"]),
    ("text label file, Latin-1", "l.txt", b"0.5\n0.2\xe9\n", [], ["not valid utf-8: byte 0xe9", "data row 2 (line 2)"]),
    ("--label-column with a text file", "l.txt", b"0.5\n", ["--label-column", "y"],
     ["--label-column applies to CSV and Parquet label files"]),
    ("CSV without --label-column", "t.csv", b"id,y\n1,0.5\n", [], ["--label-column is required"]),
    ("label outside the range", "t.csv", b"id,y\n1,0.5\n2,-0.5\n", ["--label-column", "y"],
     ["label -0.5 in column 'y' lies outside the public range", "data row 2 (line 3)"]),
    ("bins too many", "l.txt", b"0.5\n", ["--bins", "10000000"], ["--bins must be an integer from 1 to 1024"]),
    ("--prior-epsilon under an empirical prior", "l.txt", b"0.5\n", ["--prior", "empirical", "--prior-epsilon", "0.1"],
     ["--prior-epsilon 0.1 does nothing under --prior empirical"]),
    ("--objective for staircase", "l.txt", b"0.5\n", ["--mechanism", "staircase", "--objective", "inside"],
     ["--objective inside does nothing for --mechanism staircase"]),
    ("labels file is a directory", "t.csv", None, ["--label-column", "y"], ["labels file", "t.csv' is a directory"]),
    # parameters that privatize would refuse are not saved (ways a certified float64 release runs out at a large
    # ε): refused before the fit, so before its histogram is drawn (a failure after a draw is charged)
    ("--save of laplace at epsilon 50", "l.txt", b"0.5\n", ["--mechanism", "laplace", "--epsilon", "50"],
     ["laplace: epsilon=50 on the range [0, 1] cannot be certified for a float64 release: epsilon above 20.1"]),
    ("--save of laplace at epsilon 500", "l.txt", b"0.5\n", ["--mechanism", "laplace", "--epsilon", "500"],
     ["laplace: epsilon=500 on the range [0, 1] cannot be certified for a float64 release: epsilon above 20.1"]),
    ("--save of rpwithprior at epsilon 100", "l.txt", b"0.5\n", ["--epsilon", "100"],
     ["rpwithprior: epsilon=90 on the range [0, 1] cannot be certified for a float64 release: epsilon above 20.1"]),
    # --save and --json publish functions of the raw labels under an empirical prior: only if it is declared public
    ("--save under an empirical prior", "l.txt", b"0.5\n", ["--prior", "empirical"],
     ["--prior empirical with --save publishes functions of the raw labels", "--prior-is-public"]),
    ("--json under an empirical prior", "l.txt", b"0.5\n", ["--prior", "empirical", "--json"],
     ["--prior empirical with --save and --json publishes functions of the raw labels", "--prior-is-public"]),
    ("--prior-is-public without --prior empirical", "l.txt", b"0.5\n", ["--prior-is-public"],
     ["--prior-is-public does nothing without --prior empirical"]),
    # epsilon and the range before any work; the ledger (in the test's folder) is never created by a failed fit
    ("epsilon nan", "l.txt", b"0.5\n", ["--epsilon", "nan"], ["epsilon must be positive and finite, got epsilon=nan"]),
    ("one epsilon of two inf", "l.txt", b"0.5\n", ["--epsilon", "1", "inf"],
     ["epsilon must be positive and finite, got epsilon=inf"]),
    ("one epsilon of two beyond float64", "l.txt", b"0.5\n", ["--epsilon", "1", "1e999"],
     ["argument --epsilon: '1e999' lies outside float64's range (it would read as inf)"]),
    ("rpwithprior at epsilon 1e-20", "l.txt", b"0.5\n", ["--epsilon", "1e-20"],
     ["epsilon is too small for the exact integer noise sampler of the private histogram", "got epsilon=1e-20",
      "the smallest accepted is 1.95e-16"]),
    ("rr-on-bins at epsilon 1e-20", "l.txt", b"0.5\n", ["--mechanism", "rr-on-bins", "--epsilon", "1e-20"],
     ["epsilon is too small for the exact integer noise sampler", "got epsilon=1e-20"]),
    ("range wider than float64", "l.txt", b"0.5\n", ["--range", "-1e308", "1e308"],
     ["range is too wide: its width hi - lo is not finite in float64"]),
]


@pytest.mark.parametrize("case, name, content, options, fragments", FIT_CASES, ids=[c[0] for c in FIT_CASES])
def test_fit_bad_input(tmp_path, capsys, case, name, content, options, fragments):
    (tmp_path / name).mkdir() if content is None else (tmp_path / name).write_bytes(content)
    mechanism = [] if "--mechanism" in options else ["--mechanism", "rpwithprior"]
    range_ = [] if "--range" in options else ["--range", "0", "1"]  # an option given twice is refused
    code, _, err = run(["fit", "--labels", tmp_path / name, *range_, *mechanism, "--epsilon", "1",
                        "--save", tmp_path / "out" / "p.json", "--ledger", tmp_path / "ledger.jsonl", *options], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("rpwjax fit: error: "), err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert listing(tmp_path) == [name]


def test_fit_json_under_an_empirical_prior_needs_prior_is_public_and_the_printout_does_not(tmp_path, capsys):
    (tmp_path / "l.txt").write_bytes(b"0.25\n0.5\n")
    fit = ["fit", "--labels", tmp_path / "l.txt", "--range", "0", "1", "--mechanism", "laplace", "--epsilon", "1",
           "--prior", "empirical"]
    code, out, err = run([*fit, "--json"], capsys)
    assert code == 2 and out == "" and "--prior empirical with --json publishes functions of the raw labels" in err
    code, out, err = run([*fit, "--json", "--prior-is-public"], capsys)
    assert code == 0 and json.loads(out.splitlines()[0])["prior"]["public_prior_required"] is True, err
    code, out, err = run(fit, capsys)  # the plain printout is the operator's, on the terminal
    assert code == 0 and out.startswith("laplace epsilon=1"), err


# --------------------------------------------------------------------------- the Python API

def _api_entry_points():
    """Every public function that takes raw labels: ``name -> call(labels)`` (release and fit laplace also ``clip``)."""
    import rpwjax

    laplace = rpwjax.fit("laplace", [0.5], range=(0.0, 1.0), epsilon=1.0, seed=0)
    secret = rpwjax.Secret.from_seed(0)
    features = np.linspace(0.0, 1.0, 40)[:, None]
    calls = {
        "release": lambda y, clip=False: rpwjax.release(laplace.params, secret, y, clip=clip),
        "release_grid": lambda y: rpwjax.release_grid(laplace.params, secret, y),
        # Laplace does not read the labels to fit: they are checked all the same
        "fit laplace": lambda y, clip=False: rpwjax.fit("laplace", y, range=(0.0, 1.0), epsilon=1.0, seed=0,
                                                        clip=clip),
        "fit rpwithprior": lambda y: rpwjax.fit("rpwithprior", y, range=(0.0, 1.0), epsilon=1.0, seed=0),
        "fit empirical": lambda y: rpwjax.fit("rpwithprior", y, range=(0.0, 1.0), epsilon=1.0, prior="empirical"),
        "empirical_prior": lambda y: rpwjax.empirical_prior(y, 0.0, 1.0),
        "private_histogram": lambda y: rpwjax.private_histogram(y, 0.0, 1.0, 0.5, bins=8, secret=secret),
    }
    for name, row in PIPELINES.items():
        calls[f"pipeline {name}"] = (lambda row: lambda y: row.run(features, y, 0.0, 1.0, 1.0, secret=secret,
                                                                   epochs=1))(row)
    return calls


BAD_LABELS = [(np.nan, "labels must be finite, got labels[7]=nan"),
              (np.inf, "labels must be finite, got labels[7]=inf"),
              (-np.inf, "labels must be finite, got labels[7]=-inf"),
              (1.5, "labels must lie in the public range [0.0, 1.0], got labels[7]=1.5")]
API_ENTRY_POINTS = ["release", "release_grid", "fit laplace", "fit rpwithprior", "fit empirical", "empirical_prior",
                    "private_histogram", *(f"pipeline {name}" for name in PIPELINES)]


@pytest.mark.parametrize("entry_point", slow_unless(API_ENTRY_POINTS, fast=["release", "fit laplace", "pipeline auto"]))
@pytest.mark.parametrize("bad, message", BAD_LABELS, ids=["nan", "inf", "-inf", "outside"])
def test_python_entry_points_refuse_bad_labels_naming_the_value_and_the_row(entry_point, bad, message):
    y = np.full(40, 0.5)
    y[7] = bad
    with pytest.raises(InputError) as err:
        _api_entry_points()[entry_point](y)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_clip_true_clips_labels_outside_the_range_and_never_a_non_finite_one():
    calls = _api_entry_points()
    y = np.full(40, 0.5)
    y[7] = 1.5
    inside = np.clip(y, 0.0, 1.0)
    np.testing.assert_array_equal(calls["release"](y, clip=True), calls["release"](inside))
    assert calls["fit laplace"](y, clip=True).records() == calls["fit laplace"](inside).records()
    y[7] = np.nan
    for name in ("release", "fit laplace"):
        with pytest.raises(InputError, match=r"labels must be finite, got labels\[7\]=nan"):
            calls[name](y, clip=True)


@pytest.mark.slow
def test_privatize_table_errors_name_rows_and_warnings_are_one_line(shared, tmp_path, capsys):
    rows = [("x", "city", "gappy", "y")] + [(str(i / 10), f"c{i}", "" if i == 3 else str(i), str(i / 20))
                                            for i in range(20)]
    src = tmp_path / "t.csv"
    src.write_text(minimal_csv(rows))
    bad = tmp_path / "bad.csv"
    bad.write_text(minimal_csv(rows + [("1", "c", "1", "1.5")]))
    code, _, err = run(["privatize-table", bad, "-o", tmp_path / "o.csv", "--label-column", "y", "--range", "0", "1",
                        "--epsilon", "1", "--key-file", shared / "key"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "label 1.5 in column 'y' lies outside the public range [0.0, 1.0], at data row 21 (line 22)" in err
    code, _, err = run(["privatize-table", src, "-o", tmp_path / "o.csv", "--label-column", "y", "--range", "0", "1",
                        "--epsilon", "1", "--epochs", "3", "--key-file", shared / "key"], capsys)
    assert code == 2 and err.count("\n") == 1 and "--epochs 3 does nothing for --pipeline auto" in err
    dup = tmp_path / "dup.csv"
    dup.write_text("x,y,y\n1,0.5,0.5\n")
    code, _, err = run(["privatize-table", dup, "-o", tmp_path / "o.csv", "--label-column", "y", "--range", "0", "1",
                        "--epsilon", "1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "appears 2 times" in err
    # no usable feature left: the error says which columns were left out and why
    only_bad = tmp_path / "only_bad.csv"
    only_bad.write_text(minimal_csv([(c, g, y) for _, c, g, y in rows]))
    code, _, err = run(["privatize-table", only_bad, "-o", tmp_path / "o.csv", "--label-column", "y", "--range", "0",
                        "1", "--epsilon", "1", "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "has no usable numeric feature column besides 'y': left out city (not numeric (text)); gappy (integers " \
           "all distinct: an identifier) (choose columns with --features)" in err
    assert listing(tmp_path) == ["bad.csv", "dup.csv", "only_bad.csv", "t.csv"]
    code, out, err = run(["privatize-table", src, "-o", tmp_path / "o.csv", "--label-column", "y", "--range", "0",
                          "1", "--epsilon", "1", "--key-file", shared / "key"], capsys)
    assert code == 0, err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("rpwjax ")]
    assert lines and all(line.startswith("rpwjax privatize-table: features") for line in lines), err
    assert "rpwjax privatize-table: features: using 1 column(s): x" in lines
    assert any("city (not numeric (text))" in line and "gappy (integers all distinct" in line for line in lines)
    # the other columns leave as they came in, here too
    got = parse((tmp_path / "o.csv").read_bytes())
    assert [r[:3] for r in got] == [list(r[:3]) for r in rows]


# --------------------------------------------------------------------------- the Python API

# (case, fit arguments over the defaults, fragment of the message): refused before anything is fitted
API_CASES = [
    ("labels of two dimensions", {"labels": np.full((2, 50), 0.5)}, "labels must be one-dimensional"),
    ("epsilon as text", {"epsilon": "1"}, "epsilon must be a number or a list of numbers, got epsilon='1'"),
    ("epsilon as a list of text", {"epsilon": ["1"]}, "got epsilon=['1']"),
    ("epsilon as a boolean", {"epsilon": True}, "got epsilon=True"),
    ("epsilon None", {"epsilon": None}, "got epsilon=None"),
    ("prior epsilon as text", {"prior_epsilon": "0.1"}, "prior_epsilon must be a number"),
]


@pytest.mark.parametrize("case, arguments, fragment", API_CASES, ids=[c[0] for c in API_CASES])
def test_fit_refuses_bad_input_with_the_value(case, arguments, fragment):
    from rpwjax import InputError, fit

    kwargs = {"labels": np.full(100, 0.5), "range": (0, 1), "epsilon": 1.0, "seed": 0, **arguments}
    with pytest.raises(InputError) as info:
        fit("rpwithprior", kwargs.pop("labels"), **kwargs)
    assert fragment in str(info.value)


# --------------------------------------------------------------------------- row numbers deep in a big file

BIG_ROWS = 230_000
MISSING_ROW = 190_001  # 1-based data row with an empty label, about 8.6 MB into the file
TEXT_ROW = 150_000  # a text value in a numeric-looking column, past the first 4 MB read block


def _big_rows(missing: bool):
    rows = [["id", "code", "pad", "num", "y"]]
    for r in range(1, BIG_ROWS + 1):
        code = f"{r:08d}"
        num = "n/a here" if r == TEXT_ROW else str(r)
        if r == 3:
            code = "two\nlines"  # a quoted line break: every later row starts one line further down
        label = "" if missing and r == MISSING_ROW else f"{(r % 100) / 100}"
        rows.append([str(r), code, "abcdefghijklmnopqrst", num, label])
    return rows


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    (d / "missing.csv").write_text(minimal_csv(_big_rows(True)))
    (d / "good.csv").write_text(minimal_csv(_big_rows(False)))
    assert (d / "missing.csv").stat().st_size > 8 << 20
    return d


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [None, 65536, 1000])
def test_row_and_line_deep_in_a_big_csv_for_any_chunk_size(shared, big, tmp_path, capsys, chunk):
    extra = [] if chunk is None else ["--chunk-rows", chunk]
    out = tmp_path / "o.csv"
    code, _, err = run(["privatize", big / "missing.csv", "-o", out, "--label-column", "y", "--params",
                        shared / "p.json", "--quiet", *extra], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"missing label in column 'y' (an empty field) at data row {MISSING_ROW} (line {MISSING_ROW + 2})" in err
    assert listing(tmp_path) == []


@pytest.mark.slow
def test_text_in_a_numeric_column_past_the_first_block_is_kept(shared, big, tmp_path, capsys):
    out = tmp_path / "o.csv"
    code, _, err = run(["privatize", big / "good.csv", "-o", out, "--label-column", "y", "--params", shared / "p.json",
                        "--key-file", shared / "key", "--quiet"], capsys)
    assert code == 0, err
    got, want = parse(out.read_bytes()), _big_rows(False)
    assert len(got) == len(want) and got[TEXT_ROW][3] == "n/a here"
    assert all(g[:4] == w[:4] for g, w in zip(got, want))
    # bytes too: the output is the reference dialect with the new labels
    assert out.read_bytes() == minimal_csv([w[:4] + [g[4]] for g, w in zip(got, want)]).encode()


# --------------------------------------------------------------------------- non-label columns leave as they came

ODD_FIELDS = ["00501", "12345678901234567890", "12345678901234567891", "n/a", "NaN", "", "1e5", "-1.0", " padded ",
              "with,comma", 'with "quotes"', "multi\nline", "crlf\r\nline", "ünïcödé ✓", "NA", "null", "TRUE",
              "#N/A",
              "  7", "0x1A", "1,000.50", "'single'", "trailing space ", '"', ",", "\t tab"]


def _odd_rows():
    rows = [["zip", "y", "note", "id"]]
    for i, f in enumerate(ODD_FIELDS):
        rows.append([f, f"{(i % 10) / 10}", ODD_FIELDS[-1 - i], str(i)])
    return rows


@pytest.mark.parametrize("newline, bom", slow_unless([("\n", False), ("\r\n", False), ("\n", True)], fast=[("\r\n", False)]))
def test_every_other_csv_field_is_byte_identical(shared, tmp_path, capsys, newline, bom):
    rows = _odd_rows()
    src = tmp_path / "in.csv"
    data = minimal_csv(rows, newline).encode()
    src.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    out = tmp_path / "o.csv"
    code, _, err = run(["privatize", src, "-o", out, "--label-column", "y", "--params", shared / "p.json",
                        "--key-file", shared / "key", "--quiet"], capsys)
    assert code == 0, err
    raw = out.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf") == bom
    got = parse(raw[3:] if bom else raw)
    assert [[r[0], r[2], r[3]] for r in got] == [[r[0], r[2], r[3]] for r in rows]
    labels = [float(r[1]) for r in got[1:]]
    assert all(0 - 1 <= v <= 2 for v in labels)
    expected = minimal_csv([[w[0], g[1], w[2], w[3]] for g, w in zip(got, rows)], newline).encode()
    assert raw == (b"\xef\xbb\xbf" if bom else b"") + expected


def test_optional_quotes_are_kept_and_a_quoted_label_is_written_unquoted(shared, tmp_path, capsys):
    src = tmp_path / "in.csv"
    src.write_bytes(b'"a","y","b"\n"plain","0.5","x,y"\n"",0.5,"say ""hi"""\n')
    out = tmp_path / "o.csv"
    code, _, err = run(["privatize", src, "-o", out, "--label-column", "y", "--params", shared / "p.json", "--quiet"],
                       capsys)
    assert code == 0, err
    lines = out.read_bytes().split(b"\n")
    assert lines[0] == b'"a","y","b"'
    assert lines[1].startswith(b'"plain",') and lines[1].endswith(b',"x,y"')
    assert lines[2].startswith(b'"",') and lines[2].endswith(b',"say ""hi"""')
    assert all(b'"' not in line.split(b",")[1] for line in lines[1:3])  # the new labels: numbers, unquoted
    assert len(lines) == 4 and lines[3] == b""


@pytest.mark.slow
def test_latin1_with_encoding_is_read_and_written_back_in_latin1(shared, tmp_path, capsys):
    src = tmp_path / "in.csv"
    src.write_bytes(LATIN1)
    out = tmp_path / "o.csv"
    code, _, err = run(["privatize", src, "-o", out, "--label-column", "y", "--params", shared / "p.json",
                        "--encoding", "latin-1", "--quiet"], capsys)
    assert code == 0, err
    got = parse(out.read_bytes(), "latin-1")
    assert [[r[0], r[1]] for r in got] == [["id", "name"], ["1", "ok"], ["2", "café"]]
    assert b"caf\xe9," in out.read_bytes()


@pytest.mark.slow
def test_csv_output_is_the_same_for_any_chunk_size(shared, tmp_path, capsys):
    rows = [["id", "note", "y"]] + [[str(i), f"n,{i}" if i % 7 == 0 else f"n{i}", f"{(i % 10) / 10}"]
                                    for i in range(3000)]
    src = tmp_path / "in.csv"
    src.write_text(minimal_csv(rows))
    outputs = []
    for chunk in (1, 7, 1000, 1 << 20):
        out = tmp_path / f"o{chunk}.csv"
        code, _, err = run(["privatize", src, "-o", out, "--label-column", "y", "--params", shared / "p.json",
                            "--key-file", shared / "key", "--chunk-rows", chunk, "--quiet",
                            "--release-id", "c5" * 16, "--row-offset", 0], capsys)  # one release, four chunk sizes
        assert code == 0, err
        outputs.append(out.read_bytes())
    assert all(o == outputs[0] for o in outputs[1:])


def test_parquet_keeps_the_schema_and_values_of_every_other_column(shared, tmp_path, capsys):
    n = 5
    table = pa.table({
        "int_nulls": pa.array([1, None, 3, 4, None], pa.int64()),
        "text_nulls": pa.array(["a", None, "", "NA", "n/a"]),
        "dict": pa.array(["x", "y", "x", None, "y"]).dictionary_encode(),
        "when": pa.array([0, 1, 2, 3, 4], pa.timestamp("ms", tz="UTC")),
        "money": pa.array([Decimal(f"{i}.25") for i in range(n)], pa.decimal128(10, 2)),
        "tags": pa.array([[1], [], None, [2, 3], [4]], pa.list_(pa.int64())),
        "point": pa.array([{"a": i, "b": str(i)} for i in range(n)]),
        "flag": pa.array([True, False, None, True, False]),
        "f32": pa.array([0.5, 1.5, -0.0, float("nan"), 2.5], pa.float32()),
        "y": pa.array([0.1, 0.2, 0.3, 0.4, 0.5]),
        "blob": pa.array([b"\x00\xff", b"", None, b"a", b"b"], pa.binary()),
    }).replace_schema_metadata({"owner": "test"})
    src = tmp_path / "in.parquet"
    pq.write_table(table, src)
    out = tmp_path / "o.parquet"
    code, _, err = run(["privatize", src, "-o", out, "--label-column", "y", "--params", shared / "p.json",
                        "--chunk-rows", "2", "--quiet"], capsys)
    assert code == 0, err
    before, after = pq.ParquetFile(src).schema_arrow, pq.ParquetFile(out).schema_arrow
    assert after.names == before.names and after.metadata == before.metadata
    for name in before.names:
        if name != "y":
            assert after.field(name).equals(before.field(name), check_metadata=True), name
    got, want = pq.read_table(out), pq.read_table(src)
    for name in before.names:
        if name == "f32":  # NaN is not equal to itself: compare the numbers
            np.testing.assert_array_equal(got.column(name).to_numpy(), want.column(name).to_numpy())
        elif name != "y":
            assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert got.schema.field("y").type == pa.float64()


# --------------------------------------------------------------------------- SIGINT and SIGTERM


def start(argv, cwd):
    return subprocess.Popen([sys.executable, "-m", "rpwjax.cli", *map(str, argv)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def assert_stopped(proc, sig, command, ledger_file=None):
    """Send ``sig``: the run ends with its exit code (a segmentation fault would be -11) and one line. With
    ``ledger_file``, a run stopped after its private histogram was drawn is charged for it: then a line before
    says so, and the ledger holds that one failed line (returned: True when charged)."""
    if proc.poll() is not None:
        raise AssertionError(f"the run ended (exit {proc.returncode}) before it could be interrupted: "
                             f"{proc.communicate()[1]!r}")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err
    charged = ledger_file is not None and ledger_file.exists()
    if charged:
        (line,) = ledger.read(ledger_file)
        assert line["failed"] is True and line["rows"] is None and line["epsilon"] > 0, line
        first, err = err.split("\n", 1)
        assert first.startswith(f"ledger {ledger_file.name}: this run failed after drawing private values"), first
    assert err == f"{command}: interrupted by {signal.Signals(sig).name}; unfinished outputs were removed\n", err
    return charged


@pytest.mark.parametrize("sig, seconds", slow_unless(
    [(signal.SIGINT, 0.3), (signal.SIGTERM, 0.3), (signal.SIGINT, 0.8)], fast=[(signal.SIGINT, 0.3)]))
def test_a_signal_in_the_first_second_stops_the_run(shared, tmp_path, sig, seconds):
    # while the command line imports JAX: once swallowed by JAX's garbage-collector callback (exit 0, a release)
    (tmp_path / "in.csv").write_text("id,y\n" + "".join(f"{i},{(i % 10) / 10}\n" for i in range(100)))
    proc = start(["privatize", "in.csv", "-o", "out/o.csv", "--label-column", "y", *INLINE, "--quiet"], tmp_path)
    time.sleep(seconds)
    assert_stopped(proc, sig, "rpwjax privatize")
    assert listing(tmp_path) == ["in.csv"]


@pytest.fixture(scope="module")
def million(tmp_path_factory):
    """A CSV of 1.5 million labels: an inline fit's read pass takes a while."""
    path = tmp_path_factory.mktemp("million") / "big.csv"
    y = np.random.default_rng(0).integers(0, 1000, 1_500_000) / 1000
    path.write_text("id,y\n" + "".join(f"{i},{v}\n" for i, v in enumerate(y)))
    return path


def _open_by(pid: int, path) -> bool:
    with contextlib.suppress(OSError):
        return any(os.path.realpath(f"/proc/{pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{pid}/fd"))
    return False


def _wait(proc, condition, seconds=300):
    start_time = time.monotonic()
    while proc.poll() is None and not condition() and time.monotonic() - start_time < seconds:
        time.sleep(0.01)


# (moment, signal, seconds after the moment begins); the fit's read pass ends when the input is closed again
INLINE_FIT_MOMENTS = [("read pass", signal.SIGINT, 0.2), ("read pass", signal.SIGTERM, 0.2),
                      ("fit", signal.SIGINT, 0.5), ("fit", signal.SIGTERM, 0.5), ("fit", signal.SIGINT, 2.0),
                      ("fit", signal.SIGTERM, 1.0)]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds the read pass through /proc")
@pytest.mark.parametrize("moment, sig, seconds", slow_unless(
    INLINE_FIT_MOMENTS, fast=[INLINE_FIT_MOMENTS[0], INLINE_FIT_MOMENTS[2]]))
def test_a_signal_during_an_inline_fit_stops_the_run(million, tmp_path, moment, sig, seconds):
    # once, in the fit (XLA compiling and running): "unfinished outputs were removed", then a segmentation fault
    # (exit 139) as the interpreter shut down around XLA's threads
    proc = start(["privatize", million, "-o", "out/o.csv", "--label-column", "y", *INLINE, "--quiet", "--ledger",
                  "ledger.jsonl"], tmp_path)  # the ledger was checked before the read pass
    reading = lambda: _open_by(proc.pid, million.resolve())  # noqa: E731
    _wait(proc, reading)
    if moment == "fit":
        _wait(proc, lambda: not reading())
    assert not (tmp_path / "out").exists()  # the release has not begun
    time.sleep(seconds)
    # stopped after its histogram was drawn, the run is charged for it (that ledger line, no output); before, no line
    charged = assert_stopped(proc, sig, "rpwjax privatize", ledger_file=tmp_path / "ledger.jsonl")
    assert listing(tmp_path) == (["ledger.jsonl"] if charged else [])



@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_run_leaves_nothing_and_says_one_line(shared, tmp_path, sig, code):
    src = tmp_path / "in.csv"
    src.write_text("id,note,y\n" + "".join(f'{i},"n,{i}",{(i % 100) / 99}\n' for i in range(20_000)))
    before = listing(tmp_path)
    # one row per chunk: the run takes many seconds, and the signal comes once output is being written
    proc = subprocess.Popen([sys.executable, "-m", "rpwjax.cli", "privatize", str(src), "-o",
                             str(tmp_path / "out" / "o.csv"), "--label-column", "y", "--params",
                             str(shared / "p.json"), "--key-file", str(shared / "key"), "--chunk-rows", "1", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start = time.monotonic()
    part = None
    while time.monotonic() - start < 300 and proc.poll() is None:
        parts = [p for p in (tmp_path / "out").glob(".o.csv.*.part") if ".json." not in p.name] \
            if (tmp_path / "out").is_dir() else []
        if parts and parts[0].stat().st_size > 4096:
            part = parts[0]
            break
        time.sleep(0.05)
    assert part is not None and proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    assert err.count("\n") == 1 and f"interrupted by {signal.Signals(sig).name}" in err, err
    assert listing(tmp_path) == before  # no output, no sidecar, no .part file, no out/ directory


# (case, options after the input and output ({t}: the test's folder, which holds in.csv and a key file), fragments of
# the one-line message): a refused or failed privatize-table leaves nothing, its ledger included
TABLE_CASES = [
    ("--budget passed", ["--epsilon", "1", "--budget", "0.5", "--ledger", "{t}/ledger.jsonl"],
     ["--budget 0.5: this release (epsilon 1) would take input", "nothing was written"]),
    ("--budget passed, the key file's ledger", ["--epsilon", "1", "--budget", "0.5", "--key-file", "{t}/key"],
     ["--budget 0.5", "nothing was written"]),
    ("bad label late", ["--epsilon", "1", "--ledger", "{t}/ledger.jsonl", "--clip"],
     ["label nan in column 'y' is not a finite number, at data row 40 (line 41)"]),
    ("epsilon nan", ["--epsilon", "nan", "--ledger", "{t}/ledger.jsonl"],
     ["epsilon must be positive and finite, got epsilon=nan"]),
    ("epsilon 1e999", ["--epsilon", "1e999", "--ledger", "{t}/ledger.jsonl"],
     ["argument --epsilon: '1e999' lies outside float64's range (it would read as inf)"]),
    ("--epsilon given twice", ["--epsilon", "1", "--epsilon", "2", "--ledger", "{t}/ledger.jsonl"],
     ["argument --epsilon: given twice (1 and 2): give it once"]),
    ("--features with --exclude", ["--epsilon", "1", "--features", "x", "--exclude", "z", "--ledger",
                                   "{t}/ledger.jsonl"],
     ["--exclude z does nothing with --features x: --features uses exactly the columns it names"]),
    ("epsilon 1e-300", ["--epsilon", "1e-300", "--ledger", "{t}/ledger.jsonl"],
     ["epsilon is too small for the exact integer noise sampler", "got epsilon=1e-300", "the smallest accepted is 3.28e-10"]),
    ("range wider than float64", ["--epsilon", "1", "--range", "-1e308", "1e308", "--ledger", "{t}/ledger.jsonl"],
     ["range is too wide: its width hi - lo is not finite in float64"]),
]


@pytest.mark.parametrize("case, options, fragments", TABLE_CASES, ids=[c[0] for c in TABLE_CASES])
def test_privatize_table_refuses_bad_input_and_leaves_nothing(tmp_path, capsys, case, options, fragments):
    rows = [f"{i % 7 / 7:.3f},{i % 5 / 5:.3f}" for i in range(39)] + ["0.5,nan"]  # a bad label in the last row
    (tmp_path / "in.csv").write_text("x,y\n" + "".join(r + "\n" for r in rows))
    fixed_key(tmp_path / "key")
    range_ = [] if "--range" in options else ["--range", "0", "1"]  # an option given twice is refused
    code, _, err = run(["privatize-table", tmp_path / "in.csv", "-o", tmp_path / "out" / "o.csv", "--label-column",
                        "y", *range_, "--quiet", *[o.format(t=tmp_path) for o in options]], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("rpwjax privatize-table: error: "), err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert listing(tmp_path) == ["in.csv", "key"]  # no output, no sidecar, no ledger (key.ledger.jsonl either)


FEATURES_TABLE = "x,zip,y\n0.5,02134,0.25\n1.5,02139,0.75\n2.5,10001,0.5\n"


@pytest.mark.parametrize("options, message", [
    (["--features", "x", "nope"], "--features names column(s) not in the table: 'nope'; columns are x, zip, y"),
    (["--exclude", "nope", "other"], "--exclude names column(s) not in the table: 'nope', 'other'"),
    (["--features", "x", "y"], "--features names the label column 'y': the label is private and never a feature"),
    (["--exclude", "y"], "--exclude names the label column 'y'"),
    (["--features", "x", "--exclude", "x"], "--exclude x does nothing with --features x"),
    (["--features", "x", "--exclude", "zip"], "--exclude zip does nothing with --features x: --features uses exactly "
                                              "the columns it names (give one of the two)"),
    (["--features", "x", "x"], "--features names 'x' more than once"),
    (["--exclude", "x"], "no usable numeric feature column besides 'y': left out x (--exclude); zip (leading zeros (e.g. '02134')"),
])
def test_privatize_table_refuses_features_it_cannot_use(shared, tmp_path, capsys, options, message):
    src = tmp_path / "t.csv"
    src.write_text(FEATURES_TABLE)
    code, _, err = run(["privatize-table", src, "-o", tmp_path / "o.csv", "--label-column", "y", "--range", "0", "1",
                        "--epsilon", "1", "--key-file", shared / "key", "--quiet", *options], capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert listing(tmp_path) == ["t.csv"]


def test_a_text_feature_on_purpose_must_hold_numbers(shared, tmp_path, capsys):
    src = tmp_path / "t.csv"
    src.write_text("x,code,y\n0.5,A1,0.25\n1.5,B2,0.75\n")
    code, _, err = run(["privatize-table", src, "-o", tmp_path / "o.csv", "--label-column", "y", "--range", "0", "1",
                        "--epsilon", "1", "--features", "code", "--quiet"], capsys)
    assert code == 2 and "--features code: column 'code' is not numeric: it holds 'A1'" in err, err
    assert listing(tmp_path) == ["t.csv"]


@pytest.mark.parametrize("value, minimum, maximum, expected", [
    (5, 1, None, 5), (np.int64(5), 1, None, 5), (5.0, 1, None, 5), (2**70, 0, None, 2**70), (0, 0, 3, 0),
    (3, 0, 3, 3), (True, 0, None, None), ("3", 1, None, None), (3.5, 1, None, None), (float("nan"), 1, None, None),
    (float("inf"), 1, None, None), (0, 1, None, None), (4, 0, 3, None), (None, 1, None, None), ([3], 1, None, None)])
def test_one_integer_check_names_the_option_bounds_and_value(value, minimum, maximum, expected):
    from rpwjax.errors import check_integer

    if expected is not None:
        assert check_integer(value, "n", minimum, maximum) == expected
        assert type(check_integer(value, "n", minimum, maximum)) is int
        return
    bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    with pytest.raises(InputError) as err:
        check_integer(value, "n", minimum, maximum)
    assert str(err.value) == f"n must be an integer {bounds}, got n={value!r}"


def test_a_refused_release_records_no_spend_and_a_clipped_one_records_one():
    from rpwjax.accounting import Accounting

    params = rpwjax.fit("laplace", np.zeros(1), range=(0.0, 1.0), epsilon=1.0).params
    secret = rpwjax.Secret(bytes(range(32)))
    y = np.full(40, 0.5)
    y[7] = 1.5
    book = Accounting(rows=40, epsilon=1.0)
    with pytest.raises(InputError, match=r"got labels\[7\]=1.5"):
        rpwjax.release(params, secret, y, accounting=book)
    assert book.spends == []  # the kernel found the label: nothing released, nothing spent
    out = rpwjax.release(params, secret, y, accounting=book, clip=True)
    assert out.shape == (40,) and [s.purpose for s in book.spends] == ["release"]
