"""Fit time of RR-on-Bins and Unbiased against support size."""

FAMILIES = ("fit-support",)


def test_fit(case, run_case):
    run_case(case)
