"""``privatize_table(..., pipeline="auto")`` on an 8-feature Parquet table, alternating with ``privatize_file``
(RPWithPrior) of the same labels."""

FAMILIES = ("privatize-table",)


def test_privatize_table(case, run_case):
    run_case(case)
