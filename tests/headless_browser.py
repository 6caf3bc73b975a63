"""Chromium for the UI tests: where it is, how it starts, and what the tests do with a page.

Chromium is a system package pip cannot install; `bash .ci/run` installs it (apt) before running
the suite. It is looked up where Debian, Ubuntu and Playwright put it, or taken from
PSRO_CHROMIUM=/path/to/chromium; Playwright drives it (it downloads none itself). A machine
without it fails the UI tests with the install command: a suite that skipped them would look
green without ever opening a UI. The one opt-out is explicit: with PSRO_TESTS_WITHOUT_BROWSER=1
they skip instead on a machine without Chromium (or Playwright), and the skip reason says so.

Both UIs are single-page apps: the HTML arrives empty and the content renders after API calls,
so every check waits for text to appear rather than for the page load. Screenshots land in
test-artifacts/screenshots/ for a person to look at.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
# Where Chromium lives when installed by apt (Debian: chromium, its launcher script and the binary;
# Ubuntu: chromium-browser) or downloaded by `playwright install chromium`.
CHROMIUM_NAMES = ("chromium", "chromium-browser")
CHROMIUM_PATHS = (
    Path("/usr/bin/chromium"),
    Path("/usr/bin/chromium-browser"),
    Path("/usr/lib/chromium/chromium"),
    Path("/usr/lib/chromium-browser/chromium-browser"),
    Path("/snap/bin/chromium"),
)
PLAYWRIGHT_BROWSERS = Path(os.environ.get("PLAYWRIGHT_BROWSERS_PATH", Path.home() / ".cache" / "ms-playwright"))
OPT_OUT = "PSRO_TESTS_WITHOUT_BROWSER"
INSTALL_HINT = "bash .ci/run installs it (apt-get install -y chromium), or set PSRO_CHROMIUM=/path/to/chromium"
# Headless and quiet: the network is closed here, and Chromium's background services would keep
# retrying refused connections.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RENDER_TIMEOUT_MS = 30_000


def find_chromium() -> Path | None:
    """The first executable Chromium: PSRO_CHROMIUM if set, then PATH, then the usual places."""
    if explicit := os.environ.get("PSRO_CHROMIUM"):
        return Path(explicit)
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return Path(found)
    downloaded = sorted(PLAYWRIGHT_BROWSERS.glob("chromium-*/chrome-linux*/chrome"), reverse=True)
    for path in (*CHROMIUM_PATHS, *downloaded):
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def require_browser() -> Path:
    """Chromium's path, or a failure saying how to install what is missing.

    Skipping is only for someone who asked for it by name (OPT_OUT=1): anything else would let
    a machine without a browser pass the suite without testing the UIs."""
    opt_out = os.environ.get(OPT_OUT, "")
    if opt_out not in ("", "0", "1"):
        pytest.fail(f"{OPT_OUT}={opt_out!r}: use 1 to skip the browser tests or 0 (or unset) to run them")
    chromium = find_chromium()
    missing = []
    if chromium is None:
        missing.append(
            f"Chromium (looked for {' and '.join(CHROMIUM_NAMES)} on PATH, "
            f"{', '.join(map(str, CHROMIUM_PATHS))} and {PLAYWRIGHT_BROWSERS}): {INSTALL_HINT}"
        )
    elif not (chromium.is_file() and os.access(chromium, os.X_OK)):
        missing.append(f"Chromium: PSRO_CHROMIUM={chromium} is not an executable file")
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package: pip install -e '.[test]'")
    if not missing:
        return chromium
    if opt_out == "1":
        pytest.skip(f"{OPT_OUT}=1 skips the browser tests; missing {'; '.join(missing)}")
    pytest.fail(f"missing {'; '.join(missing)}. To skip the browser tests on purpose, set {OPT_OUT}=1.")


@contextlib.contextmanager
def chromium_page(profile: Path) -> Iterator:
    """A page of a headless Chromium with its own empty profile."""
    chromium = require_browser()
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(chromium),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1440, "height": 1000},
        )
        context.set_default_timeout(RENDER_TIMEOUT_MS)
        try:
            yield context.new_page()
        finally:
            context.close()


def start_mlflow_ui(store: str, work: Path, env: dict[str, str], port: int) -> subprocess.Popen:
    """`mlflow ui` on the store, on 127.0.0.1, in a session of its own (stopped with its group)."""
    # no telemetry (the network is closed) and no GenAI job runner (its worker pool is slow to start)
    env = dict(env, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    return subprocess.Popen(
        [
            str(Path(sys.executable).with_name("mlflow")),
            "ui",
            "--backend-store-uri",
            store,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=work,
        env=env,
        stdout=open(work / "mlflow-ui.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def shoot(page, name: str) -> None:
    page.wait_for_timeout(500)  # let charts finish their entry animation
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


UI_WAIT_MS = 120_000  # how long a page may take to show a text


def wait_for_text(page, text: str, exact: bool = False):
    """Wait until ``text`` renders (the SPA fills the page after its API calls, which took more
    than Playwright's default 30 s once, with three stacks of tests/test_hosts.py beside it)."""
    locator = page.get_by_text(text, exact=exact).first
    locator.wait_for(state="visible", timeout=UI_WAIT_MS)
    return locator


def close_mlflow_assistant(page) -> None:
    """MLflow 3 opens an assistant panel on first visit; close it so the run has the room."""
    close = page.get_by_role("button", name="Close")
    if close.count():
        close.first.click()


def dismiss_mlflow_dialog(page) -> None:
    dialog = page.get_by_role("dialog")
    if dialog.count():
        dialog.get_by_role("button", name="Close").first.click()
        dialog.first.wait_for(state="hidden")
