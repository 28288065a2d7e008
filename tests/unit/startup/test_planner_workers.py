"""Which of Spark's Python worker factories end after planning, and what happens where Spark changed."""

from __future__ import annotations

import logging

from py4j.protocol import Py4JError

from sink_service.startup import planner_workers


class _Factory:
    def __init__(self, daemon: bool = True):
        self.daemon, self.stopped = daemon, False

    def useDaemonEnabled(self) -> bool:
        return self.daemon

    def stop(self) -> None:
        self.stopped = True


class _Entry:
    def __init__(self, module: str, factory: _Factory):
        self.module, self.factory = module, factory

    def _1(self):
        entry = self

        class Key:
            def workerModule(self) -> str:
                return entry.module
        return Key()

    def _2(self) -> _Factory:
        return self.factory


class _Map:
    def __init__(self, entries: list[_Entry]):
        self.entries = entries

    def clone(self) -> _Map:
        return _Map(list(self.entries))

    def iterator(self):
        items = iter(self.entries)

        class It:
            def __init__(self):
                self.pending = list(items)

            def hasNext(self) -> bool:
                return bool(self.pending)

            def next(self):
                return self.pending.pop(0)
        return It()


class _Spark:
    """Just what stop_planner_daemons reaches through py4j."""

    def __init__(self, workers: _Map):
        spark = self

        class Field:
            def setAccessible(self, flag: bool) -> None:
                pass

            def get(self, env: object) -> _Map:
                return workers

        class Jvm:
            class java:
                class lang:
                    class Class:
                        @staticmethod
                        def forName(name: str):
                            assert name == "org.apache.spark.SparkEnv"

                            class C:
                                def getDeclaredField(self, name: str):
                                    assert name == "pythonWorkers"
                                    return Field()
                            return C()

        class Sc:
            def env(self) -> object:
                return object()

        class Jsc:
            def sc(self) -> Sc:
                return Sc()

        spark._jvm, spark._jsc = Jvm(), Jsc()


def test_only_the_planning_steps_daemons_are_stopped() -> None:
    tasks, runner = _Factory(), _Factory(daemon=False)
    create, plan = _Factory(), _Factory()
    workers = _Map([_Entry("pyspark.worker", tasks), _Entry("pyspark.sql.worker.create_data_source", create),
                    _Entry("pyspark.sql.streaming.python_streaming_source_runner", runner),
                    _Entry("pyspark.sql.worker.plan_data_source_read", plan)])
    stopped = planner_workers.stop_planner_daemons(_Spark(workers))
    assert stopped == ["pyspark.sql.worker.create_data_source", "pyspark.sql.worker.plan_data_source_read"]
    assert create.stopped and plan.stopped
    assert not tasks.stopped and not runner.stopped  # the tasks' pool and the running planner stay


class _Query:
    def __init__(self, run_id: str, progress: object | None):
        self.run_id, self.progress = run_id, progress

    def runId(self):
        run_id = self.run_id

        class Id:
            def toString(self) -> str:
                return run_id
        return Id()

    def lastProgress(self):
        return self.progress


class _Streams:
    def __init__(self, queries: list[_Query]):
        self.queries = queries

    def active(self) -> list[_Query]:
        return self.queries


class _Session:
    """What the releaser asks the session: the job ids of each query run's job group."""

    def __init__(self) -> None:
        self.jobs: dict[str, list[int]] = {}
        session = self

        class Tracker:
            def getJobIdsForGroup(self, group: str) -> list[int]:
                return session.jobs.get(group, [])

        class Context:
            def statusTracker(self) -> Tracker:
                return Tracker()

        self.sparkContext = Context()


def test_each_query_releases_once_after_its_first_progress(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(planner_workers, "stop_planner_daemons", lambda spark: calls.append(1) or [])
    releaser = planner_workers.PlannerReleaser(spark=_Session())
    streams = _Streams([_Query("a", None)])
    releaser._poll(streams)
    assert calls == []  # still planning its first batch
    streams.queries = [_Query("a", object())]
    releaser._poll(streams)
    releaser._poll(streams)
    assert calls == [1] and releaser.releases == 1
    streams.queries = [_Query("b", object())]  # the query restarted (a rebalance): it planned again
    releaser._poll(streams)
    assert calls == [1, 1] and releaser.releases == 2


def test_a_query_releases_once_its_first_batch_has_a_job(monkeypatch) -> None:
    """The first batch's job starts after its read is planned: the planning processes need not
    stay beside the task workers until the batch is done (the 1M backlog's peak was there)."""
    calls: list[int] = []
    monkeypatch.setattr(planner_workers, "stop_planner_daemons", lambda spark: calls.append(1) or [])
    session = _Session()
    releaser = planner_workers.PlannerReleaser(spark=session)
    streams = _Streams([_Query("a", None)])
    session.jobs["an earlier run"] = [0]  # another run's job says nothing about this one
    releaser._poll(streams)
    assert calls == []
    session.jobs["a"] = [1]  # Spark's streaming thread runs the batch's job in the group of its run id
    releaser._poll(streams)
    releaser._poll(streams)
    assert calls == [1] and releaser.releases == 1


def test_a_changed_spark_internal_leaves_the_processes_and_says_so(monkeypatch, caplog) -> None:
    def changed(spark: object) -> list[str]:
        raise Py4JError("pythonWorkers does not exist")

    monkeypatch.setattr(planner_workers, "stop_planner_daemons", changed)
    releaser = planner_workers.PlannerReleaser(spark=None, interval_s=0)

    class Session:
        class _jsparkSession:
            @staticmethod
            def streams() -> _Streams:
                return _Streams([_Query("a", object())])

    releaser._spark = Session()
    with caplog.at_level(logging.INFO, logger="sink_service.startup.planner_workers"):
        releaser.run()  # returns: the thread ends instead of retrying every poll
    assert "planning processes stay until Spark ends them" in caplog.text
