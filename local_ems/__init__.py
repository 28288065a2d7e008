"""A local EMS-compatible upsert endpoint for the demo, the end-to-end tests and the benchmark.

It speaks the Celonis EMS continuous-push contract (BRIEF section 3) over real HTTP and really applies
upserts into SQLite, so tests can check "latest value per key" end to end instead of trusting a mock.
Standard library and pyarrow only.
"""

from local_ems.client import LocalEmsClient
from local_ems.server import LocalEmsServer

__all__ = ["LocalEmsClient", "LocalEmsServer"]
