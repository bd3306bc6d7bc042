"""Streaming big files: bounded memory, every row kept in order."""

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROWS = 50_000_000
GROUP = 1_000_000


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
    subprocess.run([sys.executable, "-m", "rpwjax.cli", "keygen", "-o", str(key)], check=True, capture_output=True)
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


@pytest.mark.slow
def test_five_million_row_csv_streams_under_one_gigabyte_and_keeps_every_field(tmp_path):
    import pyarrow.csv as pacsv

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
    with open(src, "rb") as f, open(out, "rb") as g:  # quotes only where the dialect needs them
        assert f.readline() == b'"row","note","y"\n' and g.readline() == b"row,note,y\n"
        assert f.readline().split(b",")[:2] == g.readline().split(b",")[:2] == [b"0", b"00"]
