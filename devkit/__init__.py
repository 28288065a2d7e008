"""Local development kit: test brokers, sample workloads and the service as a child process.

Used by the demo, the tests and the benchmark; not part of the deployed service.
"""
