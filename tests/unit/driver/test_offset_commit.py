"""Contiguous commits: never commit past a range that did not finish."""

from __future__ import annotations

from sink_service.driver.offset_commit import ContiguousCommits, RangeOutcome

T0, T1, U0 = ("t", 0), ("t", 1), ("u", 0)


def ok(tp, start, end, committable=None):
    return RangeOutcome(tp[0], tp[1], start, end, end if committable is None else committable, "ok")


def failed(tp, start, end, committable=None, status="retryable"):
    return RangeOutcome(tp[0], tp[1], start, end, start if committable is None else committable, status)


def test_contiguous_ranges_commit_to_the_last_end():
    commits = ContiguousCommits({T0: 0})
    result, gaps = commits.advance([ok(T0, 0, 10), ok(T0, 10, 20), ok(T0, 20, 25)])
    assert result == {T0: 25}
    assert gaps == []
    assert commits.positions[T0] == 25


def test_outcome_order_does_not_matter():
    commits = ContiguousCommits({T0: 0})
    result, gaps = commits.advance([ok(T0, 20, 25), ok(T0, 0, 10), ok(T0, 10, 20)])
    assert result == {T0: 25}
    assert gaps == []


def test_failed_range_stops_the_run_even_if_later_ranges_succeeded():
    commits = ContiguousCommits({T0: 0})
    result, gaps = commits.advance([ok(T0, 0, 10), failed(T0, 10, 20), ok(T0, 20, 30)])
    assert result == {T0: 10}
    assert gaps == []
    assert commits.positions[T0] == 10


def test_failed_first_range_commits_nothing():
    commits = ContiguousCommits({T0: 0})
    result, _ = commits.advance([failed(T0, 0, 10), ok(T0, 10, 20)])
    assert result == {}
    assert commits.positions[T0] == 0


def test_failed_range_commits_what_it_did_upload():
    commits = ContiguousCommits({T0: 0})
    outcomes = [ok(T0, 0, 10), failed(T0, 10, 20, committable=14, status="fatal"), ok(T0, 20, 30)]
    result, _ = commits.advance(outcomes)
    assert result == {T0: 14}


def test_ok_range_with_committable_short_of_its_end_commits_up_to_committable_and_stops():
    commits = ContiguousCommits({T0: 0})
    result, gaps = commits.advance([ok(T0, 0, 10, committable=7), ok(T0, 10, 20)])
    assert result == {T0: 7}
    assert gaps == []


def test_gap_is_reported_and_nothing_past_it_is_committed():
    commits = ContiguousCommits({T0: 0})
    result, gaps = commits.advance([ok(T0, 0, 10), ok(T0, 12, 20), ok(T0, 20, 30)])
    assert result == {T0: 10}
    assert len(gaps) == 1
    assert "topic=t partition=0" in gaps[0]
    assert "12" in gaps[0] and "10" in gaps[0]


def test_gap_at_the_committed_offset_commits_nothing():
    commits = ContiguousCommits({T0: 100})
    result, gaps = commits.advance([ok(T0, 150, 200)])
    assert result == {}
    assert len(gaps) == 1
    assert commits.positions[T0] == 100


def test_range_starting_before_the_committed_offset_is_not_committed_over():
    commits = ContiguousCommits({T0: 100})
    result, gaps = commits.advance([ok(T0, 50, 150)])
    assert result == {}
    assert len(gaps) == 1


def test_partitions_are_independent():
    commits = ContiguousCommits({T0: 0, T1: 0, U0: 5})
    result, gaps = commits.advance([
        ok(T0, 0, 10), failed(T1, 0, 10), ok(U0, 5, 9), ok(U0, 9, 12),
    ])
    assert result == {T0: 10, U0: 12}
    assert gaps == []


def test_partition_discovered_mid_run_starts_at_its_first_range():
    commits = ContiguousCommits({T0: 0})
    result, gaps = commits.advance([ok(U0, 40, 50), ok(U0, 50, 60), ok(T0, 0, 1)])
    assert result == {T0: 1, U0: 60}
    assert gaps == []
    assert commits.positions[U0] == 60


def test_discovered_partition_with_failed_first_range_commits_nothing_past_its_start():
    commits = ContiguousCommits({})
    result, gaps = commits.advance([failed(U0, 40, 50), ok(U0, 50, 60)])
    # Committing the resolved start itself is harmless (and pins a `latest` start); nothing more.
    assert result.get(U0, 40) == 40
    assert gaps == []


def test_positions_carry_over_between_batches():
    commits = ContiguousCommits({T0: 0})
    assert commits.advance([ok(T0, 0, 10)])[0] == {T0: 10}
    assert commits.advance([ok(T0, 10, 20)])[0] == {T0: 20}
    # A batch that starts past the committed offset is a gap.
    result, gaps = commits.advance([ok(T0, 25, 30)])
    assert result == {} and gaps


def test_no_outcomes_no_commits():
    commits = ContiguousCommits({T0: 3})
    assert commits.advance([]) == ({}, [])


def test_unchanged_position_is_not_recommitted():
    commits = ContiguousCommits({T0: 10})
    result, gaps = commits.advance([ok(T0, 10, 10)])  # empty range (marker only)
    assert result == {}
    assert gaps == []


def test_constructor_copies_positions():
    positions = {T0: 0}
    commits = ContiguousCommits(positions)
    commits.advance([ok(T0, 0, 5)])
    assert positions == {T0: 0}
