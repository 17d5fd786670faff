"""`gpuwise validate`'s measured times: a decode that the runs' noise drives to zero or below
(full run minus the one-token run, over a few tokens on a busy machine) is no reading, and
says why, rather than a negative time (found by tests/test_doc_examples.py)."""

from __future__ import annotations

from gpuwise.app.validate import _not_a_reading


def test_a_time_at_or_below_zero_is_no_reading_and_says_why():
    assert _not_a_reading(None) == "" and _not_a_reading(0.0123) == ""
    for seconds in (0.0, -0.0257):
        why = _not_a_reading(seconds)
        assert "noise" in why and "--new-tokens" in why
