"""Exact interval search against prior size, histogram bins (next to the O(k³) reference) and ε-grid size."""

FAMILIES = ("search-labels", "search-histogram", "search-epsilons")


def test_interval_search(case, run_case):
    run_case(case)
