"""Problem set 3 (a stale-sampler study): skeleton, visible and hidden tests, reference.

The checks every problem set shares (the skeleton, its points, clean failures, the reference pasted
into the skeleton) are in tests/test_problem_sets.py. Here:

* the instructor's reference passes every visible and hidden test with full points;
* a known slip (U_k from the incremental ratio pi_{k+1}/pi_k) loses the points of its hand-worked test.
"""
from __future__ import annotations

import pytest

from rlkit.exercises.problem_sets import get_problem_set, run_tests
from rlkit.exercises.solutions import ps3 as SOL

PS = get_problem_set("ps3")
pytestmark = pytest.mark.usefixtures("one_torch_thread")     # the learning tests run on one thread


def test_reference_passes_all():
    ns = SOL.reference_namespace()
    results = run_tests(ns, PS.visible + SOL.HIDDEN)
    bad = [r.message for r in results if not r.passed or r.points != r.max_points]
    assert not bad, bad


def test_the_incremental_ratio_loses_the_update_shift_points():
    def incremental(logp_new, logp_prox, logp_behav, mask=None):
        return SOL.staleness_estimate(logp_new, logp_prox, mask)       # 1/2 mean |pi_{k+1}/pi_k - 1|

    ns = dict(SOL.reference_namespace(), update_shift_estimate=incremental)
    got = {r.name: r for r in run_tests(ns, [t for t in PS.visible if t.name == "update_shift_hand_cases"])}
    r = got["update_shift_hand_cases"]
    assert not r.passed and "incremental ratio" in r.message, r.message
