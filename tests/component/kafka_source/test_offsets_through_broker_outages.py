"""Reading the group's commits while the broker goes away and comes back must not abort the process.

librdkafka 2.16's admin client asserts (`rd_kafka_enq_once_del_source_return: eonce->refcnt > 0`) and
aborts when a request to the group coordinator cannot be sent (librdkafka #4605). A service exited
with SIGABRT that way in a broker-fault test; KafkaOffsets read commits through the admin API then.
The reads run in a child process, because the failure this guards against kills its process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from devkit.kafka_data import create_topics, reset_offsets

OUTAGES = 3
READERS = 4  # threads asking at once, as the driver's offset monitor, query restarts and tools do

READ_IN_A_LOOP = textwrap.dedent("""
    import sys, threading, time
    from confluent_kafka import KafkaException
    from sink_service.kafka_source import offsets as offsets_module
    from sink_service.kafka_source.offsets import KafkaOffsets

    # Many more questions per outage than the service asks (each gives up after 1 s, not 8 s): the
    # abort needs a request caught between the coordinator going away and its timeout.
    offsets_module._ATTEMPT_S = 1.0

    bootstrap, topic, group, readers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    reads = []
    def read():
        offsets = KafkaOffsets({"bootstrap.servers": bootstrap, "log_level": 0}, group)
        while True:
            try:
                reads.append(offsets.committed([(topic, 0), (topic, 1)]))
            except KafkaException:
                pass  # the broker is down: a refusal or a timeout is an answer, an abort is not
    for _ in range(readers):
        threading.Thread(target=read, daemon=True).start()
    for line in sys.stdin:  # the test writes a line after each outage, and closes stdin at the end
        print(len(reads), flush=True)
""")


def test_reading_commits_through_broker_restarts_never_aborts(own_broker):
    bootstrap, topic, group = own_broker.bootstrap, "outage-reads", "outage-reads-group"
    create_topics(bootstrap, {topic: 2})
    reset_offsets(bootstrap, group, {(topic, 0): 3, (topic, 1): 5})
    reader = subprocess.Popen([sys.executable, "-c", READ_IN_A_LOOP, bootstrap, topic, group, str(READERS)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(OUTAGES):
            time.sleep(1.5)
            own_broker.stop()
            time.sleep(2)
            own_broker.start()
            time.sleep(1.5)
            assert reader.poll() is None, f"the reader died ({reader.returncode}): {reader.stderr.read()[-2000:]}"
            reader.stdin.write("next\n")
            reader.stdin.flush()
            assert int(reader.stdout.readline() or 0) > 0, "no read was answered"
    finally:
        reader.kill()
        reader.wait()
