"""The run as a person sees it: MLflow's and Prefect's UIs in headless Chromium.

After a short `psro run` (a real Prefect server, Ray and an MLflow store, as in
tests/test_end_to_end.py), `mlflow ui` and `prefect server start` serve what the run recorded,
both on 127.0.0.1, and Playwright drives the machine's Chromium (it downloads none itself) through
the pages the README points to. Both UIs are single-page apps: the HTML arrives empty and the
content renders after API calls, so every check waits for text to appear rather than for the
page load. Screenshots land in test-artifacts/screenshots/ for a person to look at.

Chromium is a system package pip cannot install; `bash .ci/run` installs it (apt) before running
the suite. It is looked up where Debian, Ubuntu and Playwright put it, or taken from
PSRO_CHROMIUM=/path/to/chromium. A machine without it fails these tests with the install command:
a suite that skipped them would look green without ever opening a UI. The one opt-out is
explicit: with PSRO_TESTS_WITHOUT_BROWSER=1 they skip instead on a machine without Chromium
(or Playwright), and the skip reason says so.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from processes import assert_all_exited, mlflow_store, prefect_home

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
# Where Chromium lives when installed by apt (Debian: chromium, its launcher script and the binary;
# Ubuntu: chromium-browser) or downloaded by `playwright install chromium`.
CHROMIUM_NAMES = ("chromium", "chromium-browser")
CHROMIUM_PATHS = (
    Path("/usr/bin/chromium"), Path("/usr/bin/chromium-browser"), Path("/usr/lib/chromium/chromium"),
    Path("/usr/lib/chromium-browser/chromium-browser"), Path("/snap/bin/chromium"),
)
PLAYWRIGHT_BROWSERS = Path(os.environ.get("PLAYWRIGHT_BROWSERS_PATH", Path.home() / ".cache" / "ms-playwright"))
OPT_OUT = "PSRO_TESTS_WITHOUT_BROWSER"
INSTALL_HINT = "bash .ci/run installs it (apt-get install -y chromium), or set PSRO_CHROMIUM=/path/to/chromium"
ITERATIONS = 3
EXPERIMENT = "browser"
# Headless and quiet: the network is closed here, and Chromium's background services would keep
# retrying refused connections.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
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


def _require_browser() -> Path:
    """Chromium's path, or a failure saying how to install what is missing.

    Skipping is only for someone who asked for it by name (OPT_OUT=1): anything else would let
    a machine without a browser pass the suite without testing the UIs."""
    opt_out = os.environ.get(OPT_OUT, "")
    if opt_out not in ("", "0", "1"):
        pytest.fail(f"{OPT_OUT}={opt_out!r}: use 1 to skip the browser tests or 0 (or unset) to run them")
    chromium = find_chromium()
    missing = []
    if chromium is None:
        missing.append(f"Chromium (looked for {' and '.join(CHROMIUM_NAMES)} on PATH, "
                       f"{', '.join(map(str, CHROMIUM_PATHS))} and {PLAYWRIGHT_BROWSERS}): {INSTALL_HINT}")
    elif not (chromium.is_file() and os.access(chromium, os.X_OK)):
        missing.append(f"Chromium: PSRO_CHROMIUM={chromium} is not an executable file")
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package: pip install -e '.[test]'")
    if not missing:
        return chromium
    if opt_out == "1":
        pytest.skip(f"{OPT_OUT}=1 skips the browser tests; missing {'; '.join(missing)}")
    pytest.fail(f"missing {'; '.join(missing)}. To skip the browser tests on purpose, set {OPT_OUT}=1.")


@pytest.fixture
def machine_without_chromium(tmp_path, monkeypatch):
    """Nothing on PATH, none of the usual places, no Playwright download, no override."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM_PATHS", (tmp_path / "chromium",))
    monkeypatch.setattr(sys.modules[__name__], "PLAYWRIGHT_BROWSERS", tmp_path)
    monkeypatch.delenv("PSRO_CHROMIUM", raising=False)
    monkeypatch.delenv(OPT_OUT, raising=False)
    return tmp_path


def _outcome_of_require_browser() -> BaseException:
    """What _require_browser raised, caught here: pytest.raises would let a skip through, and
    the test asserting a failure would then skip itself."""
    try:
        _require_browser()
    except BaseException as outcome:  # pytest's fail and skip are BaseExceptions
        return outcome
    raise AssertionError("_require_browser() returned on a machine without Chromium")


def test_without_chromium_the_browser_tests_fail_with_the_install_command(machine_without_chromium):
    outcome = _outcome_of_require_browser()
    assert isinstance(outcome, pytest.fail.Exception), f"{type(outcome).__name__}: {outcome}"
    assert re.search(r"^missing Chromium .*bash \.ci/run installs it.*set PSRO_TESTS_WITHOUT_BROWSER=1\.$", str(outcome)), outcome


def test_the_opt_out_turns_the_failure_into_a_skip_that_says_why(machine_without_chromium, monkeypatch):
    monkeypatch.setenv(OPT_OUT, "1")
    outcome = _outcome_of_require_browser()
    assert isinstance(outcome, pytest.skip.Exception), f"{type(outcome).__name__}: {outcome}"
    assert str(outcome).startswith("PSRO_TESTS_WITHOUT_BROWSER=1 skips the browser tests; missing Chromium"), outcome
    monkeypatch.setenv(OPT_OUT, "yes")
    outcome = _outcome_of_require_browser()
    assert isinstance(outcome, pytest.fail.Exception), f"{type(outcome).__name__}: {outcome}"
    assert str(outcome) == "PSRO_TESTS_WITHOUT_BROWSER='yes': use 1 to skip the browser tests or 0 (or unset) to run them"


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
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM_PATHS", (home / "usr-lib-chromium" / "chromium",))
    assert find_chromium() == path


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _post(url: str, body: dict):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def served_run(tmp_path_factory):
    """A finished short run, with `mlflow ui` on its store and Prefect's server (UI included) on
    its database, both on 127.0.0.1. The Prefect server is started first and the run reports to
    it; `mlflow ui` boots while the run runs. Yields the run and both UIs' addresses."""
    from flows.runtime import LocalPrefectServer, free_port
    from flows.tracking.run_tracker import prepare_store

    _require_browser()
    work = tmp_path_factory.mktemp("browser")
    uri = mlflow_store(work)
    marker = f"PREFECT_HOME={work / 'prefect-home'}"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_"))}
    env["PREFECT_HOME"] = str(prefect_home(work / "prefect-home"))
    prefect = LocalPrefectServer(work / "prefect-home")
    mlflow_ui = None
    try:
        prepare_store(uri)  # while the Prefect server boots; `mlflow ui` needs the store to exist
        prefect.wait()
        port = free_port()
        # no telemetry (the network is closed) and no GenAI job runner (its worker pool is slow to start)
        mlflow_env = dict(env, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true", MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
        mlflow_ui = subprocess.Popen(
            [str(Path(sys.executable).with_name("mlflow")), "ui", "--backend-store-uri", uri,
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            cwd=work, env=mlflow_env, stdout=open(work / "mlflow-ui.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        command = [
            str(Path(sys.executable).with_name("psro")), "run", "--game", "kuhn_poker", "--iterations", str(ITERATIONS),
            "--tracking-uri", uri, "--experiment", EXPERIMENT, "--num-cpus", "2",
        ]
        result = subprocess.run(command, cwd=work, env=dict(env, PREFECT_API_URL=prefect.url), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        deadline = time.monotonic() + 90
        while not _healthy(f"http://127.0.0.1:{port}/health"):
            assert mlflow_ui.poll() is None and time.monotonic() < deadline, (work / "mlflow-ui.log").read_text()[-2000:]
            time.sleep(0.3)
        import mlflow

        client = mlflow.MlflowClient(tracking_uri=uri)
        run = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])[0]
        yield run, f"http://127.0.0.1:{port}", prefect.url.removesuffix("/api")
    finally:
        if mlflow_ui and mlflow_ui.poll() is None:
            os.killpg(mlflow_ui.pid, signal.SIGTERM)
            mlflow_ui.wait(timeout=30)
        prefect.stop()
        assert_all_exited(marker)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = _require_browser()
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(chromium), headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1440, "height": 1000},
        )
        context.set_default_timeout(RENDER_TIMEOUT_MS)
        try:
            yield context.new_page()
        finally:
            context.close()


def _shoot(page, name: str) -> None:
    page.wait_for_timeout(500)  # let charts finish their entry animation
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def _text(page, text: str, exact: bool = False):
    """Wait until ``text`` renders (the SPA fills the page after its API calls)."""
    locator = page.get_by_text(text, exact=exact).first
    locator.wait_for(state="visible")
    return locator


@pytest.mark.slow
def test_mlflow_ui_shows_the_run_its_exploitability_and_the_registered_population(served_run, browser):
    run, mlflow_url, _ = served_run
    page = browser
    run_page = f"{mlflow_url}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"

    page.goto(run_page)
    _text(page, run.info.run_name)
    _close_mlflow_assistant(page)
    page.get_by_placeholder("Search metrics").fill("exploitability")
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name="exploitability", exact=True))
    shown = row.get_by_role("cell").nth(1)
    shown.wait_for()
    assert float(shown.inner_text()) == run.data.metrics["exploitability"]  # the value the run logged last
    _shoot(page, "01-mlflow-run-overview")

    page.goto(f"{run_page}/model-metrics")
    page.get_by_placeholder("Search metric charts").fill("exploitability")
    _text(page, "exploitability", exact=True)
    _shoot(page, "02-mlflow-exploitability-chart")

    page.goto(f"{run_page}/artifacts/plots/exploitability.png")
    _text(page, "plots/exploitability.png")
    page.wait_for_function("() => [...document.images].some(image => image.complete && image.naturalWidth >= 400)")
    _shoot(page, "03-mlflow-exploitability-plot")

    page.goto(f"{mlflow_url}/#/models")
    for player in (0, 1):
        _text(page, f"{EXPERIMENT}-kuhn_poker-player_{player}")
    _dismiss_mlflow_dialog(page)
    _shoot(page, "04-mlflow-registered-models")

    page.goto(f"{mlflow_url}/#/models/{EXPERIMENT}-kuhn_poker-player_0")
    _text(page, "@ newest")
    _text(page, f"Version {ITERATIONS + 1}")
    _shoot(page, "05-mlflow-population-versions")


def _close_mlflow_assistant(page) -> None:
    """MLflow 3 opens an assistant panel on first visit; close it so the run has the room."""
    close = page.get_by_role("button", name="Close")
    if close.count():
        close.first.click()


def _dismiss_mlflow_dialog(page) -> None:
    dialog = page.get_by_role("dialog")
    if dialog.count():
        dialog.get_by_role("button", name="Close").first.click()
        dialog.first.wait_for(state="hidden")


@pytest.mark.slow
def test_prefect_ui_shows_the_flow_run_its_iterations_and_their_tasks(served_run, browser):
    _, _, prefect_url = served_run
    page = browser
    flows = {f["id"]: f["name"] for f in _post(f"{prefect_url}/api/flows/filter", {})}
    runs = _post(f"{prefect_url}/api/flow_runs/filter", {})
    psro = next(r for r in runs if flows[r["flow_id"]] == "psro")
    iterations = [r for r in runs if flows[r["flow_id"]] == "psro-iteration"]
    assert len(iterations) == ITERATIONS + 1

    page.goto(f"{prefect_url}/runs")
    _text(page, iterations[0]["name"])
    page.get_by_text("Hide subflows", exact=True).click()  # the list then holds the psro run alone
    _text(page, psro["name"]).scroll_into_view_if_needed()
    _shoot(page, "06-prefect-runs")

    page.goto(f"{prefect_url}/runs/flow-run/{psro['id']}")
    _text(page, psro["name"])
    page.get_by_text("Subflow Runs", exact=True).click()
    for run in iterations:
        _text(page, run["name"])
    _shoot(page, "07-prefect-psro-subflows")

    last = max(iterations, key=lambda r: r["start_time"])
    page.goto(f"{prefect_url}/runs/flow-run/{last['id']}")
    page.get_by_text("Task Runs", exact=True).click()
    for task in ("train-best-response", "evaluate-payoffs", "solve-meta-game", "measure-exploitability"):
        _text(page, task)
    _shoot(page, "08-prefect-iteration-tasks")
