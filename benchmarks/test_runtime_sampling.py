"""Sampling throughput of every registered mechanism against n, next to the uniform floor."""

FAMILIES = ("sampling",)


def test_sampling(case, run_case):
    run_case(case)
