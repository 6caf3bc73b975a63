"""How the UI tests find Chromium, and what they do on a machine without it.

The UI tests themselves (MLflow's and Prefect's UIs in headless Chromium) open the pages of the
short run in tests/test_end_to_end.py; tests/headless_browser.py finds and starts the browser.
"""

from __future__ import annotations

import re

import headless_browser
import pytest
from headless_browser import OPT_OUT, find_chromium, require_browser


@pytest.fixture
def machine_without_chromium(tmp_path, monkeypatch):
    """Nothing on PATH, none of the usual places, no Playwright download, no override."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(headless_browser, "CHROMIUM_PATHS", (tmp_path / "chromium",))
    monkeypatch.setattr(headless_browser, "PLAYWRIGHT_BROWSERS", tmp_path)
    monkeypatch.delenv("PSRO_CHROMIUM", raising=False)
    monkeypatch.delenv(OPT_OUT, raising=False)
    return tmp_path


def _outcome_of_require_browser() -> BaseException:
    """What require_browser raised, caught here: pytest.raises would let a skip through, and
    the test asserting a failure would then skip itself."""
    try:
        require_browser()
    except BaseException as outcome:  # pytest's fail and skip are BaseExceptions
        return outcome
    raise AssertionError("require_browser() returned on a machine without Chromium")


def test_without_chromium_the_browser_tests_fail_with_the_install_command(machine_without_chromium):
    outcome = _outcome_of_require_browser()
    assert isinstance(outcome, pytest.fail.Exception), f"{type(outcome).__name__}: {outcome}"
    assert re.search(
        r"^missing Chromium .*bash \.ci/run installs it.*set PSRO_TESTS_WITHOUT_BROWSER=1\.$", str(outcome)
    ), outcome


def test_the_opt_out_turns_the_failure_into_a_skip_that_says_why(machine_without_chromium, monkeypatch):
    monkeypatch.setenv(OPT_OUT, "1")
    outcome = _outcome_of_require_browser()
    assert isinstance(outcome, pytest.skip.Exception), f"{type(outcome).__name__}: {outcome}"
    assert str(outcome).startswith("PSRO_TESTS_WITHOUT_BROWSER=1 skips the browser tests; missing Chromium"), outcome
    monkeypatch.setenv(OPT_OUT, "yes")
    outcome = _outcome_of_require_browser()
    assert isinstance(outcome, pytest.fail.Exception), f"{type(outcome).__name__}: {outcome}"
    assert (
        str(outcome) == "PSRO_TESTS_WITHOUT_BROWSER='yes': use 1 to skip the browser tests or 0 (or unset) to run them"
    )


@pytest.mark.parametrize("where", ["PATH", "Debian's binary", "Playwright's download"])
def test_chromium_is_found_wherever_it_is_installed(machine_without_chromium, monkeypatch, where):
    home = machine_without_chromium
    path = {
        "PATH": home / "bin" / "chromium-browser",
        "Debian's binary": home / "usr-lib-chromium" / "chromium",
        "Playwright's download": home / "chromium-1187" / "chrome-linux" / "chrome",
    }[where]
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    monkeypatch.setenv("PATH", str(home / "bin"))
    monkeypatch.setattr(headless_browser, "CHROMIUM_PATHS", (home / "usr-lib-chromium" / "chromium",))
    assert find_chromium() == path
