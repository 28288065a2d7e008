"""Per-partition admission: record, byte and time thresholds, and the file budget."""

from __future__ import annotations

import itertools
import random

from sink_service.kafka_source.admission import BEHIND_INTERVALS, Admission, Thresholds

A, B, C, D = ("t", 0), ("t", 1), ("t", 2), ("u", 0)


def admission(records=100, bytes_=1 << 30, interval_s=60.0, max_ranges=1000, first_ranges=None,
              max_batch_records=800_000) -> Admission:
    return Admission(Thresholds(records=records, bytes=bytes_, interval_s=interval_s, max_ranges_per_batch=max_ranges,
                                max_batch_records=max_batch_records, first_batch_ranges=first_ranges))


def test_below_every_threshold_nothing_is_admitted():
    adm = admission()
    end = adm.plan({A: 0}, {A: 99}, now=0.0)
    assert end == {A: 0}
    assert adm.pending_since == {A: 0.0}


def test_record_threshold_admits_only_whole_files():
    adm = admission(records=100)
    assert adm.plan({A: 0}, {A: 100}, now=0.0) == {A: 100}
    assert adm.plan({A: 1000}, {A: 1250}, now=1.0) == {A: 1200}


def test_record_threshold_is_per_partition():
    adm = admission(records=100)
    end = adm.plan({A: 0, B: 50}, {A: 150, B: 120}, now=0.0)
    assert end == {A: 100, B: 50}


def test_byte_threshold_uses_the_per_topic_estimate():
    adm = admission(records=1000, bytes_=10_000)
    # 100 bytes per record -> a file's worth is 100 records.
    end = adm.plan({A: 0, D: 0}, {A: 250, D: 250}, now=0.0, bytes_per_record={"t": 100.0})
    assert end[A] == 200  # two whole 100-record files
    assert end[D] == 0  # no estimate for topic "u": only the record threshold applies


def test_byte_estimate_never_raises_the_record_threshold():
    adm = admission(records=100, bytes_=1_000_000)
    end = adm.plan({A: 0}, {A: 150}, now=0.0, bytes_per_record={"t": 1.0})
    assert end == {A: 100}


def test_huge_records_still_admit_one_record_per_file():
    adm = admission(records=100, bytes_=1000)
    end = adm.plan({A: 0}, {A: 3}, now=0.0, bytes_per_record={"t": 5000.0})
    assert end == {A: 3}


def test_time_threshold_admits_an_idle_partition_while_another_is_busy():
    adm = admission(records=100, interval_s=10.0)
    # t=0: the idle partition A gets 3 records; B is busy.
    assert adm.plan({A: 0, B: 0}, {A: 3, B: 250}, now=0.0) == {A: 0, B: 200}
    # t=9.9: still within the interval for A; B keeps getting whole files.
    assert adm.plan({A: 0, B: 200}, {A: 3, B: 420}, now=9.9) == {A: 0, B: 400}
    # t=10: A's oldest pending record has waited the interval: admitted although B is busy.
    end = adm.plan({A: 0, B: 400}, {A: 3, B: 650}, now=10.0)
    assert end[A] == 3
    assert A not in adm.pending_since


def test_time_threshold_is_measured_from_the_look_before_the_records_appeared():
    adm = admission(records=100, interval_s=5.0)
    adm.plan({A: 0}, {A: 0}, now=0.0)  # nothing pending yet
    # First seen at 3.0, but it may have arrived just after the look at 0.0 (a long micro-batch
    # in between): it is dated 0.0, so it is never admitted later than the interval after arrival.
    assert adm.plan({A: 0}, {A: 1}, now=3.0) == {A: 0}
    assert adm.pending_since[A] == 0.0
    assert adm.plan({A: 0}, {A: 2}, now=4.9) == {A: 0}
    assert adm.plan({A: 0}, {A: 2}, now=5.0) == {A: 2}


def test_records_present_at_the_first_look_are_dated_by_it():
    adm = admission(records=100, interval_s=5.0)
    assert adm.plan({A: 0}, {A: 1}, now=3.0) == {A: 0}
    assert adm.pending_since[A] == 3.0
    assert adm.plan({A: 0}, {A: 1}, now=7.9) == {A: 0}
    assert adm.plan({A: 0}, {A: 1}, now=8.0) == {A: 1}


def test_pending_since_is_reset_when_drained():
    adm = admission(records=100, interval_s=5.0)
    adm.plan({A: 0}, {A: 1}, now=0.0)
    assert adm.plan({A: 0}, {A: 1}, now=5.0) == {A: 1}
    assert A not in adm.pending_since
    # New data starts a new wait, from the previous look.
    assert adm.plan({A: 1}, {A: 2}, now=6.0) == {A: 1}
    assert adm.pending_since[A] == 5.0
    assert adm.plan({A: 1}, {A: 2}, now=9.9) == {A: 1}
    assert adm.plan({A: 1}, {A: 2}, now=10.0) == {A: 2}


def test_pending_since_is_forgotten_when_nothing_is_pending():
    adm = admission(records=100, interval_s=5.0)
    adm.plan({A: 0}, {A: 1}, now=0.0)
    # Something else (e.g. a restart) moved the start up to the end.
    adm.plan({A: 1}, {A: 1}, now=1.0)
    assert A not in adm.pending_since


def test_partitions_with_nothing_pending_keep_their_start():
    adm = admission(records=10, interval_s=0.0)
    end = adm.plan({A: 5, B: 7, C: 9}, {A: 5, B: 20}, now=0.0)
    assert end == {A: 5, B: 20, C: 9}


def test_partitions_unknown_to_start_are_ignored():
    adm = admission(records=10)
    assert adm.plan({A: 0}, {A: 10, B: 100}, now=0.0) == {A: 10}


def test_range_budget_one_file_each_before_anyone_gets_two_oldest_first():
    adm = admission(records=10, interval_s=100.0, max_ranges=3)
    adm.plan({C: 0}, {C: 5}, now=0.0)  # C pending since 0 (below threshold)
    adm.plan({C: 0, B: 0}, {C: 5, B: 5}, now=1.0)  # B pending since the look at 0
    adm.plan({C: 0, B: 0, A: 0}, {C: 5, B: 5, A: 5}, now=2.0)  # A pending since 1
    start = {A: 0, B: 0, C: 0, D: 0}
    end = adm.plan(start, {A: 50, B: 50, C: 50, D: 50}, now=3.0)  # D pending since 2
    # Three ranges: one file each for the three oldest partitions; D waits.
    assert end == {A: 10, B: 10, C: 10, D: 0}


def test_leftover_budget_goes_round_robin():
    adm = admission(records=10, max_ranges=5)
    end = adm.plan({A: 0, B: 0}, {A: 100, B: 25}, now=0.0)
    # A, B, A, B, A: B has only two whole files.
    assert end == {A: 30, B: 20}


def test_budget_limited_partition_keeps_its_wait_and_is_drained_later():
    adm = admission(records=10, interval_s=5.0, max_ranges=1)
    assert adm.plan({A: 0}, {A: 25}, now=0.0) == {A: 10}
    assert adm.pending_since[A] == 0.0
    assert adm.plan({A: 10}, {A: 25}, now=1.0) == {A: 20}
    # After the interval the rest is due, one range per batch.
    assert adm.plan({A: 20}, {A: 25}, now=5.0) == {A: 25}
    assert A not in adm.pending_since


def test_first_admitting_batch_holds_one_wave_then_the_full_budget_applies():
    adm = admission(records=100, max_ranges=8, first_ranges=2)
    start = {A: 0, B: 0, C: 0}
    available = {A: 400, B: 400, C: 400}
    # Nothing pending yet does not use up the first-batch cap.
    assert adm.plan({D: 0}, {D: 0}, now=0.0) == {D: 0}
    first = adm.plan(start, available, now=0.0)
    assert sum((first[tp] - start[tp]) // 100 for tp in start) == 2
    second = adm.plan(first, available, now=1.0)
    assert sum((second[tp] - first[tp]) // 100 for tp in start) == 8


def test_time_due_partition_gets_one_range_per_budget_unit():
    adm = admission(records=10, interval_s=0.0, max_ranges=2)
    end = adm.plan({A: 0}, {A: 35}, now=0.0)
    assert end == {A: 20}
    assert adm.pending_since == {A: 0.0}


def test_old_idle_partition_is_not_starved_by_busy_partitions_with_younger_data():
    """Two busy partitions receive one file's worth per batch and always keep a sub-file
    remainder; the budget is two ranges. Partition D gets 3 records at t=1 and nothing after.
    From t=6 on, D's records are the oldest pending records anywhere (A's and B's pending
    records all arrived at t>=5), so "oldest first" must admit D soon after its interval,
    while A and B are busy."""
    adm = admission(records=10, interval_s=5.0, max_ranges=2)
    start = {A: 0, B: 0, D: 0}
    available = {A: 15, B: 15, D: 0}
    admitted_d_at = None
    for t in range(0, 30):
        if t == 1:
            available[D] = 3
        if t > 0:
            available[A] += 10
            available[B] += 10
        end = adm.plan(start, available, now=float(t))
        assert sum(1 for tp in end if end[tp] != start[tp]) <= 2
        if end[D] == 3:
            admitted_d_at = t
            break
        start = end
    assert admitted_d_at is not None and admitted_d_at <= 8, (
        f"D (3 records pending since t=1, interval 5s) still not admitted at t=29; "
        f"pending_since={adm.pending_since}"
    )


def test_plan_keeps_within_the_file_budget():
    adm = admission(records=10, interval_s=0.0, max_ranges=7)
    start = {A: 0, B: 3, C: 100}
    end = adm.plan(start, {A: 95, B: 4, C: 1000}, now=0.0)
    files = sum(-(-(end[tp] - start[tp]) // 10) for tp in start)
    assert 0 < files <= 7
    assert all(start[tp] <= end[tp] for tp in start)


def test_a_timed_batch_takes_partitions_half_an_interval_old():
    adm = admission(records=100, interval_s=10.0)
    looks = [(0.0, {A: 3, B: 0, C: 0}),  # A's records date from t=0
             (4.0, {A: 3, B: 0, C: 0}),
             (5.0, {A: 3, B: 4, C: 0}),  # B's from t=4, the look before
             (5.5, {A: 3, B: 4, C: 0}),
             (6.0, {A: 3, B: 4, C: 5}),  # C's from t=5.5
             (9.99, {A: 3, B: 4, C: 5})]
    for now, available in looks:
        assert adm.plan({A: 0, B: 0, C: 0}, available, now=now) == {A: 0, B: 0, C: 0}
    # t=10: A is due by time; B has waited 6 s, over half the interval: it rides along, with
    # everything pending. C has waited 4.5 s: it stays.
    assert adm.plan({A: 0, B: 0, C: 0}, {A: 3, B: 4, C: 5}, now=10.0) == {A: 3, B: 4, C: 0}
    assert adm.pending_since == {C: 5.5}


def test_a_batch_due_by_count_takes_no_riders():
    """A busy partition flushing by count must not halve the interval of the quiet ones."""
    adm = admission(records=100, interval_s=10.0)
    adm.plan({A: 0, B: 0}, {A: 0, B: 3}, now=0.0)
    assert adm.plan({A: 0, B: 0}, {A: 100, B: 3}, now=9.0) == {A: 100, B: 0}


def _timed_batches(adm: Admission, arrivals: dict, seconds: int) -> list[tuple[float, set]]:
    """Every 0.5 s each partition gets its records; each admitting plan is a batch finishing at once."""
    start = {tp: 0 for tp in arrivals}
    available = dict(start)
    batches = []
    for step in range(seconds * 2):
        now = step / 2
        for tp, per_step in arrivals.items():
            available[tp] += per_step(step)
        end = adm.plan(start, available, now=now)
        admitted = {tp for tp in end if end[tp] != start[tp]}
        if admitted:
            batches.append((now, admitted))
        start = end
    return batches


def test_partitions_split_by_the_first_wave_fall_into_step():
    """The first batch after a start holds one wave (2 of 8 partitions here). Without riders the
    two groups kept their own phase for good: 22 batches a minute instead of 12 at a 5 s interval."""
    parts = [("t", p) for p in range(8)]
    adm = admission(records=100_000, interval_s=5.0, max_ranges=8, first_ranges=2)
    batches = _timed_batches(adm, {tp: (lambda step: 1250) for tp in parts}, seconds=60)
    assert batches[0][1] == set(parts[:2])
    assert batches[1][1] == set(parts[2:])  # the rest, at once
    assert all(admitted == set(parts) for _, admitted in batches[2:]), batches  # in step from the next
    assert len(batches) <= 60 / 5 + 1


def test_timed_batches_come_at_least_half_an_interval_apart_however_many_partitions():
    """Sporadic partitions, each with its own phase, would otherwise each cost a batch."""
    rng = random.Random(7)
    parts = [("t", p) for p in range(50)]
    phases = {tp: rng.randrange(40) for tp in parts}
    adm = admission(records=1_000_000, interval_s=5.0)
    batches = _timed_batches(adm, {tp: (lambda step, tp=tp: int(step % 40 == phases[tp])) for tp in parts},
                             seconds=120)
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(batches)]
    assert batches and min(gaps) >= 2.5, gaps
    # Still nobody waits longer than the interval (plus the 0.5 s between looks).
    assert sum(len(admitted) for _, admitted in batches) >= 50 * 2


def test_at_equal_age_the_largest_backlog_goes_first_so_a_crash_loop_starves_no_partition():
    """After a start every pending record is dated by the same first look. Ties went to the lowest
    partition, so a service that crashed after each first batch (two ranges on two cores) read only
    partitions 0 and 1, restart after restart (seen in the Delta chaos run). The larger backlog first
    serves the others as the served partitions shrink."""
    available = {A: 300, B: 300, C: 500, D: 400}
    position = dict.fromkeys(available, 0)
    served: list[set] = []
    for _life in range(3):  # each life: a new process, its first batch, then a crash
        end = admission(records=100, max_ranges=8, first_ranges=2).plan(position, available, now=0.0)
        served.append({tp for tp in end if end[tp] > position[tp]})
        position = end
    assert served[0] == {C, D}  # the largest backlogs
    assert set().union(*served) == {A, B, C, D}  # within three lives every partition moved




def test_small_ranges_released_by_time_cost_a_third_of_a_file_so_96_partitions_wait_4_batches_not_12():
    """Live at 20k records/s over 96 partitions each range is ~1,000 records: counted as a file each,
    a budget of 8 took 8 partitions a batch and each waited about 12 batches for its turn."""
    parts = [("t", p) for p in range(96)]
    adm = admission(records=100_000, interval_s=5.0, max_ranges=8)
    start = dict.fromkeys(parts, 0)
    adm.plan(start, dict.fromkeys(parts, 0), now=0.0)
    end = adm.plan(start, dict.fromkeys(parts, 1000), now=5.0)
    assert sum(1 for tp in parts if end[tp] == 1000) == 24
    assert all(end[tp] in (0, 1000) for tp in parts)  # a partition's range is whole or waits


def test_a_range_of_more_than_a_third_of_a_file_costs_its_share_and_whole_files_cost_one():
    adm = admission(records=100, interval_s=0.0, max_ranges=4)
    end = adm.plan({A: 0, B: 0, C: 0, D: 0}, {A: 500, B: 50, C: 50, D: 60}, now=0.0)
    # A's first file (1), B and C (0.5 each), D (0.6): 2.6; then A's second file (3.6); a third would pass 4.
    assert end == {A: 200, B: 50, C: 50, D: 60}
    backlog = admission(records=100, max_ranges=4).plan({A: 0, B: 0}, {A: 1000, B: 1000}, now=0.0)
    assert backlog == {A: 200, B: 200}  # whole files: four, as before


# --- records already waiting in Kafka at the first look -----------------------------------------


def test_a_first_look_dates_pending_records_by_when_kafka_says_they_were_written():
    """A backlog of partitions holding less than a file each waited the whole interval after a start."""
    adm = admission(records=100, interval_s=10.0)
    assert adm.first_looks({A: 0, B: 0, C: 5}, {A: 3, B: 3, C: 5}) == [A, B]  # C holds nothing pending
    end = adm.plan({A: 0, B: 0}, {A: 3, B: 3}, now=100.0, written_at={A: 80.0, B: 96.0})
    assert end == {A: 3, B: 0}  # A's records waited 20 s; B's 4 s (less than half: not a rider)
    assert adm.plan({A: 3, B: 0}, {A: 3, B: 3}, now=106.0) == {A: 3, B: 3}  # B's 10 s, counted from Kafka's time


def test_only_the_first_look_is_dated_by_kafka_so_old_timestamps_do_not_release_every_batch():
    """Event times or a mirror's timestamps are old on every record: each look would make them due."""
    adm = admission(records=100, interval_s=10.0)
    assert adm.plan({A: 0}, {A: 0}, now=0.0) == {A: 0}  # looked at, nothing pending
    assert adm.first_looks({A: 0}, {A: 3}) == []
    assert adm.plan({A: 0}, {A: 3}, now=1.0, written_at={A: -1000.0}) == {A: 0}
    assert adm.plan({A: 0}, {A: 3}, now=9.9) == {A: 0}
    assert adm.plan({A: 0}, {A: 3}, now=10.0) == {A: 3}  # dated by the look before them (t=0), as always


def test_a_kafka_time_later_than_the_look_does_not_delay_the_records():
    adm = admission(records=100, interval_s=10.0)
    assert adm.plan({A: 0}, {A: 3}, now=0.0, written_at={A: 50.0}) == {A: 0}  # a producer's clock ahead
    assert adm.plan({A: 0}, {A: 3}, now=10.0) == {A: 3}


# --- partitions that are behind: served by volume -------------------------------------------------

PARTS_96 = [("t", p) for p in range(96)]


def _behind_admission(max_batch_records: int = 800_000) -> Admission:
    return admission(records=10_840, bytes_=64 << 20, interval_s=10.0, max_ranges=8, first_ranges=2,
                     max_batch_records=max_batch_records)


def _second_batch(adm: Admission, at: float, bytes_per_record: dict[str, float] | None = None,
                  written_at: float | None = None) -> int:
    """Ranges in the batch after the first wave, for 96 partitions each holding one file."""
    start = dict.fromkeys(PARTS_96, 0)
    available = dict.fromkeys(PARTS_96, 10_840)
    first = adm.plan(start, available, now=0.0,
                     written_at=None if written_at is None else dict.fromkeys(PARTS_96, written_at))
    assert sum(1 for tp in PARTS_96 if first[tp]) == 2  # one wave, behind or not
    second = adm.plan(first, available, now=at, bytes_per_record=bytes_per_record)
    return sum(1 for tp in PARTS_96 if second[tp] != first[tp])


def test_partitions_behind_are_served_by_records_not_files():
    """1M records over 96 partitions in files of 10,840: eight files a batch drained it in 13 batches of 86k
    records. Behind (their records have waited BEHIND_INTERVALS intervals), they share 800k records instead."""
    assert _second_batch(_behind_admission(), at=BEHIND_INTERVALS * 10.0) == 800_000 // 10_840


def test_partitions_that_keep_up_are_still_served_in_files():
    # Due at one interval, or waiting its turn a while longer: a live partition's range, which a batch of
    # every due range would delay.
    assert _second_batch(_behind_admission(), at=10.0) == 8
    assert _second_batch(_behind_admission(), at=(BEHIND_INTERVALS - 1) * 10.0) == 8


def test_partitions_behind_are_bounded_by_the_files_bytes_too():
    """Records of 6 KB: a file of 10,840 records is ~62 MB of Parquet, so 800k records would be 74 files'
    bytes; the batch holds at most SINK_MAX_FILES_PER_BATCH files' worth of bytes."""
    assert _second_batch(_behind_admission(), at=BEHIND_INTERVALS * 10.0, bytes_per_record={"t": 6_000}) == 8


def test_a_records_budget_holds_whole_files_and_never_stalls():
    # 20,000 records: one file of 10,840 fits, a second would pass the budget.
    assert _second_batch(_behind_admission(max_batch_records=20_000), at=BEHIND_INTERVALS * 10.0) == 1
    # A budget below one file: the batch still takes one, or the partitions behind would never move.
    assert _second_batch(_behind_admission(max_batch_records=1_000), at=BEHIND_INTERVALS * 10.0) == 1


def test_a_backlog_found_at_the_first_look_is_behind_at_once():
    """Kafka's timestamps date a backlog at most an interval back (`written_at`): by its wait alone it would
    be behind only an interval later, after three more batches of eight files."""
    assert _second_batch(_behind_admission(), at=1.0, written_at=-10.0) == 800_000 // 10_840
    assert _second_batch(_behind_admission(), at=1.0, written_at=-5.0) == 8  # half an interval: keeping up
    assert _second_batch(_behind_admission(), at=1.0) == 8  # records the first look dated by itself


def test_a_partition_drained_of_its_backlog_is_served_in_files_again():
    adm = _behind_admission()
    parts = PARTS_96[:30]
    start = dict.fromkeys(parts, 0)
    first = adm.plan(start, dict.fromkeys(parts, 1000), now=0.0, written_at=dict.fromkeys(parts, -10.0))
    drained = adm.plan(first, dict.fromkeys(parts, 1000), now=1.0)
    assert all(drained[tp] == 1000 for tp in parts)  # behind: the 28 left in one batch
    # New records, live: due an interval later, each small range costs a third of a file again.
    assert adm.plan(drained, dict.fromkeys(parts, 1500), now=2.0) == drained
    later = adm.plan(drained, dict.fromkeys(parts, 1500), now=12.0)
    assert sum(1 for tp in parts if later[tp] == 1500) == 24
