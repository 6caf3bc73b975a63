"""Suite-wide guard: Prefect must never start its temporary server in the test process.

A client that finds no API URL starts one and stops it at interpreter exit, after the suite's
output is closed, and a test that reads "its" runs from it reads an empty server. Every test
talks to a server it started (or none), so with the fallback off such a slip fails loudly.
"""

import os

os.environ["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] = "false"
