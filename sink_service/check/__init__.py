"""`sink-service check`: probes of the broker, topics, group, registry and target, without side effects that matter."""
