"""The run as a person sees it: MLflow's and Prefect's UIs in headless Chromium.

After a short `psro run` (a real Prefect server, Ray and an MLflow store, as in
tests/test_end_to_end.py), `mlflow ui` and `prefect server start` serve what the run recorded,
both on 127.0.0.1, and Playwright drives Debian's Chromium (never a downloaded browser) through
the pages the README points to. Both UIs are single-page apps: the HTML arrives empty and the
content renders after API calls, so every check waits for text to appear rather than for the
page load. Screenshots land in test-artifacts/screenshots/ for a person to look at.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from processes import assert_all_exited

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
ITERATIONS = 3
EXPERIMENT = "browser"
# Headless and quiet: the network is closed here, and Chromium's background services would keep
# retrying refused connections.
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
RENDER_TIMEOUT_MS = 30_000


def _require_browser() -> None:
    """Without Chromium or Playwright: skip on a developer's machine, fail in CI (.ci/run installs both)."""
    missing = [str(CHROMIUM)] if not CHROMIUM.exists() else []
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package")
    if missing:
        message = f"missing {', '.join(missing)}: apt-get install -y chromium chromium-driver; pip install -e '.[test]' (bash .ci/run does both)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


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
    from marl_core.tracking import prepare_store

    _require_browser()
    work = tmp_path_factory.mktemp("browser")
    uri = f"sqlite:///{work}/mlflow.db"
    marker = f"PREFECT_HOME={work / 'prefect-home'}"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "RAY_"))}
    env["PREFECT_HOME"] = str(work / "prefect-home")
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
    _require_browser()
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), headless=True,
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
        _text(page, f"{EXPERIMENT}-kuhn_poker-player{player}")
    _dismiss_mlflow_dialog(page)
    _shoot(page, "04-mlflow-registered-models")

    page.goto(f"{mlflow_url}/#/models/{EXPERIMENT}-kuhn_poker-player0")
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
    for task in ("train-best-response", "expand-population", "evaluate-payoffs", "solve-meta-game", "measure-exploitability"):
        _text(page, task)
    _shoot(page, "08-prefect-iteration-tasks")
