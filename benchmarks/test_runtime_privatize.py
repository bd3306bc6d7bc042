"""``privatize_file`` end to end on a Parquet file, alternating with a plain pyarrow copy of it."""

FAMILIES = ("privatize",)


def test_privatize(case, run_case):
    run_case(case)
