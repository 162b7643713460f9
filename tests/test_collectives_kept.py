"""Every result a collective hands a replica is its own: kept results do not change at the
plan's next call (tests/kept_results.py); across instances in the per-rank suite."""

import pytest

from tests.kept_results import check_kept_results


@pytest.mark.parametrize("n", [1, 2, 4])
def test_kept_results_stay_what_they_were(local_system, n):
    check_kept_results(local_system(n))
