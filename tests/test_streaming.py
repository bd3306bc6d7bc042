"""Streaming files: bounded memory, every row kept in order, CSV fields written back byte for byte."""

import csv
import io as pyio
import json
import random
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from rpwjax import cli
from rpwjax.io import raw_csv, source as table_source
from helpers import csv_rows, fixed_key, run, slow_unless, without_field

ROWS = 50_000_000
GROUP = 1_000_000


@pytest.mark.long
@pytest.mark.slow
def test_fifty_million_row_parquet_streams_under_one_gigabyte(tmp_path):
    src = tmp_path / "big.parquet"
    schema = pa.schema([("row", pa.int64()), ("y", pa.float64())])
    with pq.ParquetWriter(src, schema) as writer:
        for g in range(ROWS // GROUP):
            rows = np.arange(g * GROUP, (g + 1) * GROUP, dtype=np.int64)
            writer.write_table(pa.table({"row": rows, "y": (rows % 1000) / 999.0}, schema=schema))
    params = tmp_path / "p.json"
    key = tmp_path / "key"
    np.savetxt(tmp_path / "train.txt", np.linspace(0, 1, 101))
    fixed_key(key)
    subprocess.run([sys.executable, "-m", "rpwjax.cli", "fit", "--labels", str(tmp_path / "train.txt"), "--range", "0",
                    "1", "--mechanism", "rpwithprior", "--epsilon", "1", "--zeta", "0.05", "--key-file", str(key),
                    "--save", str(params)],
                   check=True, capture_output=True)
    out = tmp_path / "out.parquet"
    # The child reports its own peak RSS: VmHWM belongs to the new address space made by
    # exec, whereas ru_maxrss (and RUSAGE_CHILDREN) also count the forked pytest process.
    wrapper = (
        "import sys\n"
        "from rpwjax import cli\n"
        "code = cli.main(sys.argv[1:])\n"
        "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
        "print(hwm)\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", wrapper, "privatize", str(src), "-o", str(out), "--label-column", "y",
                           "--key-file", str(key), "--params", str(params), "--quiet"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    peak_mib = int(proc.stdout.strip().splitlines()[-1]) / 1024  # VmHWM is in KiB
    assert peak_mib < 1024, f"peak RSS {peak_mib:.0f} MiB"
    side = json.loads((tmp_path / "out.parquet.json").read_text())
    assert side["rows"] == ROWS
    # rows and order preserved: the untouched column comes back in order, labels on the output grid
    reader = pq.ParquetFile(out)
    assert reader.metadata.num_rows == ROWS
    expected = 0
    (a, b), step = side["output_range"], side["output_grid"]
    for batch in reader.iter_batches(batch_size=4 * GROUP, columns=["row", "y"]):
        got = batch.column(0).to_numpy()
        assert got[0] == expected and np.all(np.diff(got) == 1)
        expected += got.size
        noisy = batch.column(1).to_numpy()
        assert a <= noisy.min() and noisy.max() <= b
        np.testing.assert_array_equal(np.round(noisy / step) * step, noisy)
    assert expected == ROWS


CSV_ROWS = 5_000_000


@pytest.mark.long
@pytest.mark.slow
def test_five_million_row_csv_streams_under_one_gigabyte_and_keeps_every_field(tmp_path):
    src = tmp_path / "big.csv"
    schema = pa.schema([("row", pa.int64()), ("note", pa.string()), ("y", pa.float64())])
    with pacsv.CSVWriter(src, schema, write_options=pacsv.WriteOptions(quoting_style="none")) as writer:
        for start in range(0, CSV_ROWS, GROUP):
            rows = np.arange(start, start + GROUP, dtype=np.int64)
            notes = np.char.add("0", rows.astype(str))  # leading zeros: text, never a number
            writer.write(pa.table({"row": rows, "note": notes, "y": (rows % 1000) / 999.0}, schema=schema))
    np.savetxt(tmp_path / "train.txt", np.linspace(0, 1, 101))
    params = tmp_path / "p.json"
    subprocess.run([sys.executable, "-m", "rpwjax.cli", "fit", "--labels", str(tmp_path / "train.txt"), "--range", "0",
                    "1", "--mechanism", "rpwithprior", "--epsilon", "1", "--zeta", "0.05", "--save", str(params)],
                   check=True, capture_output=True)
    out = tmp_path / "out.csv"
    wrapper = (
        "import sys\n"
        "from rpwjax import cli\n"
        "code = cli.main(sys.argv[1:])\n"
        "print([l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1])\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run([sys.executable, "-c", wrapper, "privatize", str(src), "-o", str(out), "--label-column", "y",
                           "--params", str(params), "--quiet"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    peak_mib = int(proc.stdout.strip().splitlines()[-1]) / 1024
    assert peak_mib < 1024, f"peak RSS {peak_mib:.0f} MiB"
    assert json.loads((tmp_path / "out.csv.json").read_text())["rows"] == CSV_ROWS
    # every other field comes back as the same text, in order
    as_text = pacsv.ConvertOptions(column_types={"row": pa.string(), "note": pa.string()},
                                   include_columns=["row", "note"])
    before, after = pacsv.read_csv(src, convert_options=as_text), pacsv.read_csv(out, convert_options=as_text)
    assert after.num_rows == CSV_ROWS and after.equals(before)
    with open(src, "rb") as f, open(out, "rb") as g:  # byte for byte: pyarrow's quoted header too
        assert f.readline() == g.readline() == b'"row","note","y"\n'
        assert f.readline().split(b",")[:2] == g.readline().split(b",")[:2] == [b"0", b"00"]


# --------------------------------------------------------------------------- CSV round trips, byte for byte

@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("fitted")
    fixed_key(d / "key")
    np.savetxt(d / "train.txt", np.linspace(0, 1, 101))
    assert cli.main(["fit", "--labels", str(d / "train.txt"), "--range", "0", "1", "--mechanism", "rpwithprior",
                     "--epsilon", "1", "--key-file", str(d / "key"), "--save", str(d / "p.json")]) == 0
    return d


def _pyarrow_written():
    """pyarrow.csv.write_csv: the header and every string quoted, numbers not."""
    table = pa.table({"id": [1, 2, 3], "name": ["x246", 'say "hi"', "a,b"], "note": ["multi\nline", "", "n/a"],
                      "y": [0.5, 0.25, 1.0]})
    sink = pa.BufferOutputStream()
    pacsv.write_csv(table, sink)
    return sink.getvalue().to_pybytes()


def _python_csv(rows, **options):
    f = pyio.StringIO(newline="")
    csv.writer(f, **options).writerows(rows)
    return f.getvalue().encode()


def _pandas_nonnumeric():
    """pandas to_csv with QUOTE_NONNUMERIC: the header and strings quoted, numbers not; the label in the middle."""
    import pandas as pd

    frame = pd.DataFrame({"id": [1, 2, 3], "city": ["Zürich", "a,b", 'q"q'], "y": [0.5, 0.125, 0.75],
                          "score": [1.5, -2.0, 3.25], "code": ["00501", "n/a", ""]})
    return frame.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC).encode()


QUOTED_ROWS = [["id", "name", "y"], ["1", "x246", "0.5"], ["2", "", "0.25"], ["3", "with, comma", "1"]]

# (case, input bytes, label column, extra options, whether the bytes of every other field come back as they were)
ROUND_TRIPS = [
    ("pyarrow write_csv", _pyarrow_written(), "y", [], True),
    ("QUOTE_ALL, CRLF, quoted labels", _python_csv(QUOTED_ROWS, quoting=csv.QUOTE_ALL), "y", [], True),
    ("QUOTE_ALL, label first", _python_csv([r[2:] + r[:2] for r in QUOTED_ROWS], quoting=csv.QUOTE_ALL), "y", [],
     True),
    ("pandas QUOTE_NONNUMERIC, label in the middle", _pandas_nonnumeric(), "y", [], True),
    ("R write.csv: an unnamed row-name column, NA", b'"","y","name","x"\n"1",0.5,"a",1.5\n"2",0.25,"b ""q""",NA\n',
     "y", [], True),
    ("delimiters, quotes and line breaks inside quotes",
     b'id,y,note\n1,"0.5","a,b"\n2,0.25,"say ""hi"", ok"\n3,1,"line\nbreak"\n4,0,"cr\rand\r\ncrlf"\n5,"1",""""\n',
     "y", [], True),
    ("CRLF", b'id,"note",y\r\n1,"x,y",0.5\r\n2,plain,0.25\r\n', "y", [], True),
    ("mixed line ends and blank lines", b'\n\nid,y,z\r\n1,0.5,a\n\n\r\n2,0.25,"b\nc"\r3,0.75,c\r\n\r\n\n', "y", [],
     True),
    ("a byte-order mark and a quoted header", b'\xef\xbb\xbf"id","name","y"\n"1","\xc3\xa9t\xc3\xa9",0.5\n', "y", [],
     True),
    ("a byte-order mark, a comma in a header field", b'\xef\xbb\xbf"a,b","n",y\n"1,2","x",0.5\n', "y", [], True),
    ("Latin-1 with --encoding", b'"id","name","y"\n1,"caf\xe9, cr\xe8me",0.5\n2,na\xefve,0.25\n', "y",
     ["--encoding", "latin-1"], True),
    ("cp1252 with --encoding", b'id,price,y\n1,"\x80 5",0.5\n2,\x93quoted\x94,0.25\n', "y", ["--encoding", "cp1252"],
     True),
    ("labels padded and quoted", b'a,y,b\nx, 0.5,"p"\ny,"0.25",q\nz," 0.75 ",r\nw,1 ,"s"\n', "y", [], True),
    ("a quote inside an unquoted field, text after a closing quote",
     b'id,height,y,note\n1,5\'11",0.5,ok\n2,"ab"cd,0.25,x"y"z\n3,6",0.75,"q,r"\n4,a""b,1,"""q"""\n', "y", [], True),
    ("empty fields, no line break at the end", b'a,b,y,c\n,"",0.5,\n"",,0.25,""', "y", [], True),
    ("a quote that never closes at the end", b'id,y,note\n1,0.5,"open\nstill open', "y", [], True),
    ("the label the only column", b'"y"\n0.5\n"0.25"\n\n1\n', "y", [], True),
    ("UTF-16 (not ASCII-compatible): rendered, values kept", _python_csv(QUOTED_ROWS, quoting=csv.QUOTE_ALL).decode()
     .encode("utf-16"), "y", ["--encoding", "utf-16"], False),
    ("a quoted label followed by a space: rendered from there, values kept", b'"id","y"\n"1","0.5" \n"2",0.25\n', "y",
     [], False),
]


def _values(data: bytes, encoding: str):
    text = data.decode(encoding)
    text = text[1:] if text.startswith("\ufeff") else text
    return [row for row in csv.reader(pyio.StringIO(text, newline=""), strict=False) if row]


def assert_round_trip(data: bytes, out: bytes, label: int, encoding="utf-8", raw=True):
    """Every non-label field (and the header) has the input's value; with ``raw``, its bytes too."""
    before, after = _values(data, encoding), _values(out, encoding)
    assert len(after) == len(before)
    assert after[0] == before[0]
    for want, got in zip(before[1:], after[1:]):
        assert len(got) == len(want)
        assert got[:label] + got[label + 1:] == want[:label] + want[label + 1:]
        assert np.isfinite(float(got[label]))
    if raw:  # the bytes around the labels, header, quotes, line breaks and blank lines included
        assert without_field(out, label) == without_field(data, label)
        assert out.split(b"\n")[0] == data.split(b"\n")[0]


# the fast subset keeps one case per kind of difficulty (quoting, line breaks, BOM, encodings, rendered rows)
FAST_ROUND_TRIPS = ("QUOTE_ALL, CRLF, quoted labels", "delimiters, quotes and line breaks inside quotes",
                    "mixed line ends and blank lines", "a byte-order mark and a quoted header", "Latin-1 with --encoding",
                    "UTF-16 (not ASCII-compatible): rendered, values kept")


@pytest.mark.parametrize("case, data, label, options, raw",
                         slow_unless(ROUND_TRIPS, fast=[c for c in ROUND_TRIPS if c[0] in FAST_ROUND_TRIPS],
                                     ids=[c[0] for c in ROUND_TRIPS]))
def test_csv_round_trip_keeps_every_other_field_byte_for_byte(fitted, tmp_path, capsys, case, data, label, options,
                                                              raw):
    src = tmp_path / "in.csv"
    src.write_bytes(data)
    out = tmp_path / "o.csv"
    code, _, err = run(["privatize", src, "-o", out, "--label-column", label, "--params", fitted / "p.json",
                        "--key-file", fitted / "key", "--quiet", *options], capsys)
    assert code == 0, err
    encoding = options[1] if options else "utf-8"
    column = _values(data, encoding)[0].index(label)
    assert_round_trip(data, out.read_bytes(), column, encoding, raw)
    if not raw and encoding == "utf-8":  # what the fallback does: the header as it was, the rows rendered
        assert out.read_bytes().split(b"\n")[0] == data.split(b"\n")[0]
        assert without_field(out.read_bytes(), column) != without_field(data, column)


def _many_rows(n=400):
    rows = []
    for i in range(n):
        note = ["plain", '"a, quoted"', '"two\nlines"', '"say ""hi"""', "5'11\"", '""'][i % 6]
        label = f'"{(i % 10) / 10}"' if i % 3 == 0 else f"{(i % 10) / 10}"
        end = ["\n", "\r\n", "\n\n"][i % 3]
        rows.append(f"{i},{note},{label}{end}")
    rows[150] = "150," + '"' + "long, " * 600 + '"' + ",0.5\n"  # longer than the read block: it grows
    return ('"id","note","y"\n' + "".join(rows)).encode()


@pytest.mark.parametrize("chunk", [7, 1000])
def test_a_csv_of_many_read_blocks_round_trips_for_any_chunk_size(fitted, tmp_path, capsys, monkeypatch, chunk):
    monkeypatch.setattr(table_source, "CSV_BLOCK_BYTES", 1024)
    data = _many_rows()
    assert len(data) > 10 * 1024
    src = tmp_path / "in.csv"
    src.write_bytes(data)
    out = tmp_path / "o.csv"
    code, _, err = run(["privatize", src, "-o", out, "--label-column", "y", "--params", fitted / "p.json",
                        "--key-file", fitted / "key", "--chunk-rows", chunk, "--quiet"], capsys)
    assert code == 0, err
    assert_round_trip(data, out.read_bytes(), 2)


def test_a_row_longer_than_the_largest_read_block_is_refused(fitted, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(table_source, "CSV_BLOCK_BYTES", 1024)
    monkeypatch.setattr(table_source, "CSV_MAX_BLOCK_BYTES", 4096)
    src = tmp_path / "in.csv"
    src.write_bytes(b"id,note,y\n" + b"".join(b"%d,n,0.5\n" % i for i in range(300)) + b"300," + b"x" * 20000
                    + b",0.5\n301,n,0.5\n")
    code, _, err = run(["privatize", src, "-o", tmp_path / "o.csv", "--label-column", "y", "--params",
                        fitted / "p.json", "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "longer than the 4096 byte read block, the largest allowed" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]


def test_the_tokenizer_cuts_rows_and_fields_as_pyarrow_does(tmp_path, monkeypatch):
    """Random CSV over a small alphabet (quotes, delimiters, CR, LF): rows, label spans and values agree."""
    rng = random.Random(20261201)
    alphabet = [b"a", b"1", b'"', b'""', b",", b"\n", b"\r", b"\r\n"]
    path = tmp_path / "f.csv"
    checked = 0
    for trial in range(3000):
        ncols = rng.randint(1, 3)
        data = b",".join(b"h%d" % i for i in range(ncols)) + b"\n" + b"".join(
            rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        reference = csv_rows(data)
        try:
            table = pacsv.read_csv(pa.py_buffer(data), read_options=pacsv.ReadOptions(autogenerate_column_names=True),
                                   parse_options=pacsv.ParseOptions(newlines_in_values=True),
                                   convert_options=pacsv.ConvertOptions(
                                       column_types={f"f{i}": pa.binary() for i in range(ncols)}))
        except pa.ArrowInvalid:  # pyarrow refuses it: the reference reads another field count somewhere
            assert any(len(spans) != ncols for spans, _, _ in reference), data
            continue
        assert [list(r.values()) for r in table.to_pylist()] == [values for _, _, values in reference], data
        path.write_bytes(data)
        label = trial % ncols
        monkeypatch.setattr(table_source, "CSV_BLOCK_BYTES", 1 << 22)
        source = table_source.TableSource(path, f"h{label}")
        monkeypatch.setattr(table_source, "CSV_BLOCK_BYTES", 1 + trial % 5)  # the tokenizer reads in tiny pieces
        rows = raw_csv.RawCsvRows(source)
        assert rows.ok and rows.header == data[:reference[0][1]], data
        previous = reference[0][1]
        for spans, end, _ in reference[1:]:
            got, start, stop = rows._take(1)
            assert bytes(got) == data[previous:end], data
            assert (previous + int(start[0]), previous + int(stop[0])) == spans[label], data
            previous = end
        assert rows._take(1) is None  # and no more rows than pyarrow's
        checked += 1
    assert checked > 300
