"""Suite-wide settings.

Prefect must never start its temporary server in the test process: a client that finds no API
URL starts one and stops it at interpreter exit, after the suite's output is closed, and a test
that reads "its" runs from it reads an empty server. Every test talks to a server it started (or
none), so with the fallback off such a slip fails loudly.

Files with slow tests run first: the suite runs in two processes that take whole files in
collection order, and long files started last would leave one process working alone at the end
while the other has nothing left; the many short files fill the gaps instead.
"""

import os

os.environ["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] = "false"


def pytest_collection_modifyitems(items):
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: files stay whole and in order
