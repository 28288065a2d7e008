"""`sink-service verify`: does the target hold the latest row of every key the topic has?

    expected.py  the topic up to the group's committed offsets, decoded by the tasks' own code,
                 spilled to Parquet a bounded batch at a time; apart, the records past them
                 (a target may hold them: the service uploads, then commits)
    target.py    the target's files (dir, s3), a local_ems table, or a Parquet export (the real EMS)
    compare.py   latest row per key on both sides and their FULL OUTER JOIN, in duckdb on disk;
                 every column of the topic's row compared, order values in the topic's type
    report.py    counts and examples as text or JSON
    run.py       the flow
"""
