"""The backlog line: records left and time to catch up, every 30 s while a backlog drains, never when caught up."""

from __future__ import annotations

import logging

from sink_service.driver.backlog import BacklogProgress

A, B = ("orders", 0), ("orders", 1)


def _feed(progress: BacklogProgress, samples: list[tuple[float, dict, dict]]) -> list:
    return [r for at, committed, end in samples if (r := progress.observe(at, committed, end)) is not None]


def test_a_draining_backlog_reports_every_30_s_with_records_left_and_eta():
    progress = BacklogProgress(caught_up_records=1000)
    # 1M records behind on A; the service commits 10k/s while 2k/s arrive: lag falls 8k/s.
    samples = [(t, {A: 10_000 * t, B: 500}, {A: 1_000_000 + 2_000 * t, B: 500}) for t in range(0, 95, 5)]
    reports = _feed(progress, samples)
    assert len(reports) == 3  # at 30, 60 and 90 s: not on every 5 s sample
    first = reports[0]
    assert first.records_left == 1_000_000 + 2_000 * 30 - 10_000 * 30
    assert (round(first.committed_per_s), round(first.arriving_per_s)) == (10_000, 2_000)
    assert first.eta_s == first.records_left / 8_000
    assert first.line() == ("backlog: 760,000 record(s) left in 1 partition(s); committing 10,000/s while "
                            "2,000/s arrive (last 30s): caught up in about 1m 35s")
    assert reports[-1].window_s == 60  # the rate comes from the last two intervals


def test_the_rate_follows_the_last_intervals_not_the_whole_run():
    progress = BacklogProgress(caught_up_records=0)
    slow = [(t, {A: 1_000 * t}, {A: 10_000_000}) for t in range(0, 65, 5)]  # 1k/s for a minute
    fast = [(60 + t, {A: 60_000 + 20_000 * t}, {A: 10_000_000}) for t in range(5, 125, 5)]  # then 20k/s
    reports = _feed(progress, slow + fast)
    assert round(reports[-1].committed_per_s) == 20_000


def test_no_line_while_caught_up_and_a_new_backlog_waits_a_whole_interval():
    progress = BacklogProgress(caught_up_records=1000)
    # Steady running: lag stays within one file's worth per partition.
    steady = [(t, {A: 100 * t, B: 100 * t}, {A: 100 * t + 900, B: 100 * t + 1000}) for t in range(0, 120, 5)]
    assert _feed(progress, steady) == []
    # A burst: the first line comes 30 s after it was first seen, not at once.
    burst = [(120 + t, {A: 12_000, B: 12_000 + 5_000 * t}, {A: 12_900, B: 500_000}) for t in range(0, 60, 5)]
    reports = _feed(progress, burst)
    assert reports and reports[0].records_left == 900 + (500_000 - 12_000 - 5_000 * 30)
    assert reports[0].partitions == 1
    # Caught up again: silent.
    assert progress.observe(200, {A: 12_900, B: 499_500}, {A: 12_900, B: 500_000}) is None
    assert progress.observe(240, {A: 12_900, B: 499_500}, {A: 12_900, B: 500_000}) is None


def test_a_backlog_that_grows_says_it_is_not_catching_up():
    progress = BacklogProgress(caught_up_records=0)
    # The endpoint is down: nothing is committed while 500/s arrive.
    reports = _feed(progress, [(t, {A: 0}, {A: 5_000 + 500 * t}) for t in range(0, 35, 5)])
    [report] = reports
    assert report.eta_s is None
    assert report.line().endswith("committing 0/s while 500/s arrive (last 30s): not catching up")


def test_an_offset_reset_backwards_counts_as_no_progress_not_negative():
    progress = BacklogProgress(caught_up_records=0)
    samples = [(0, {A: 50_000}, {A: 100_000}), (15, {A: 0}, {A: 100_000}), (30, {A: 30_000}, {A: 100_000})]
    [report] = _feed(progress, samples)
    assert report.committed_per_s == 0  # 50k -> 30k over the window: clamped, not -667/s
    assert report.records_left == 70_000


def test_the_line_is_logged_at_info_with_fields(caplog):
    progress = BacklogProgress(caught_up_records=0)
    with caplog.at_level(logging.INFO, logger="sink_service.driver.backlog"):
        for t in range(0, 35, 5):
            progress.report(t, {A: 1_000 * t}, {A: 7_200_000})
    [record] = caplog.records
    assert record.levelno == logging.INFO
    assert record.fields["records_left"] == 7_170_000 and record.fields["eta_s"] == 7_170.0
    assert record.getMessage().endswith("caught up in about 1h 59m")
