"""Run and wait times per task type (django_rtq/broker/timings.py): counted in a worker's memory,
added to Redis in one round trip, read back as histograms."""

from __future__ import annotations

import pytest

from django_rtq.broker.timings import DURATION_BOUNDS, WAIT_BOUNDS, Timings, histograms
from django_rtq.exceptions import BrokerUnavailable


def test_observations_land_in_their_buckets_and_come_back_as_histograms(broker, inspector):
    timings = Timings()
    timings.observe("default", "shop.send", ran=0.005, ok=True, waited=0.0004)  # on a bound: that bucket
    timings.observe("default", "shop.send", ran=0.3, ok=True, waited=12.0)
    timings.observe("default", "shop.send", ran=7200.0, ok=False)  # above every bound; a retry: no wait
    timings.observe("emails", "shop.mail", ran=0.02, ok=True, waited=-0.5)  # clocks apart: no wait
    timings.flush(broker.add_timings)
    assert not timings

    [failed, sent], [waited] = inspector.task_timings("default")
    assert (sent.task, sent.outcome, sent.sum) == ("shop.send", "success", pytest.approx(0.305))
    assert sent.counts[DURATION_BOUNDS.index(0.005)] == 1 and sent.counts[DURATION_BOUNDS.index(0.5)] == 1
    assert (failed.outcome, failed.counts[-1], sum(failed.counts)) == ("failure", 1, 1)
    assert waited.counts[WAIT_BOUNDS.index(0.001)] == 1 and waited.counts[WAIT_BOUNDS.index(30.0)] == 1
    cumulative = sent.cumulative()
    assert cumulative[0] == ("0.005", 1) and cumulative[-1] == ("+Inf", 2)
    [mailed], [mail_wait] = inspector.task_timings("emails")
    assert mailed.counts[DURATION_BOUNDS.index(0.025)] == 1 and mail_wait.counts[0] == 1

    timings.observe("default", "shop.send", ran=0.3, ok=True)
    timings.flush(broker.add_timings)
    [_, sent], _ = inspector.task_timings("default")
    assert sent.counts[DURATION_BOUNDS.index(0.5)] == 2  # added to, not replaced


def test_counts_redis_did_not_take_are_kept_for_the_next_flush():
    timings = Timings()
    timings.observe("default", "shop.send", ran=0.3, ok=True)

    def refuse(pending):
        raise BrokerUnavailable("Redis is unreachable: gone")

    with pytest.raises(BrokerUnavailable):
        timings.flush(refuse)
    timings.observe("default", "shop.send", ran=0.3, ok=True)
    taken = []
    timings.flush(taken.append)
    assert taken[0]["default"]["d|success|shop.send|6"] == 2


def test_fields_of_another_form_are_left_out():
    durations, waits = histograms(
        {"d|success|a|0": "2", "d|success|a|sum": "0.002", "junk": "1", "w|b|99": "1"}
    )
    assert [(h.task, h.counts[0], h.sum) for h in durations] == [("a", 2, 0.002)]
    assert [(h.task, sum(h.counts)) for h in waits] == [("b", 0)]


def test_counts_are_dropped_after_an_error_that_may_have_added_part_of_them():
    timings = Timings()
    timings.observe("default", "shop.send", ran=0.3, ok=True)

    def half_done(pending):
        raise ValueError("WRONGTYPE Operation against a key holding the wrong kind of value")

    with pytest.raises(ValueError):
        timings.flush(half_done)
    assert not timings  # adding them again could count some twice
