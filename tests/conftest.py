"""Suite-wide settings.

Prefect must never start its temporary server in the test process: a client that finds no API
URL starts one and stops it at interpreter exit, after the suite's output is closed, and a test
that reads "its" runs from it reads an empty server. Every test talks to a server it started (or
none), so with the fallback off such a slip fails loudly.

`--quick` runs the quick tier: every test but the end-to-end ones and the long learning checks
(README, docs/testing.md).

The suite runs in two processes that take whole files, the files with the most tests first
(pytest-xdist's order). Among files with as many tests, the order here decides: the files that
run for minutes first, longest first (as `--durations` last ranked them), then the other files
with slow tests, then the short files, so that a long file is not the last one left.
"""

import os

os.environ["PREFECT_SERVER_ALLOW_EPHEMERAL_MODE"] = "false"


LONGEST_FILES = (
    "test_stack.py",  # mostly waits (its faults keep services down for 100 s): beside CPU-bound files
    "test_scenarios.py",
    "test_stopping.py",
    "test_flow_matches_local.py",
    "test_approx_exploitability.py",
    "test_memory.py",
    "test_end_to_end.py",
    "test_pettingzoo_flow.py",
    "test_learned_end_to_end.py",
    "test_cluster.py",
    "test_resume.py",
    "test_deployments.py",
)


QUICK_LEAVES_OUT = ("end_to_end", "slow")  # what `--quick` deselects: the markers of pyproject.toml


def pytest_addoption(parser):
    parser.addoption(
        "--quick",
        action="store_true",
        help="the quick tier: leave out the end-to-end tests (real Prefect, Ray, MLflow, PostgreSQL) "
        "and the long learning checks",
    )


def _left_out(item) -> bool:
    return any(item.get_closest_marker(marker) for marker in QUICK_LEAVES_OUT)


def pytest_collection_modifyitems(config, items):
    if config.getoption("quick"):
        deselected = [item for item in items if _left_out(item)]
        items[:] = [item for item in items if not _left_out(item)]
        config.hook.pytest_deselected(items=deselected)
    slow_files = {item.path for item in items if _left_out(item)}

    def order(item) -> tuple[int, int]:
        if item.path.name in LONGEST_FILES:
            return 0, LONGEST_FILES.index(item.path.name)
        return (1 if item.path in slow_files else 2), 0

    items.sort(key=order)  # stable: a file's tests stay together and in their order
