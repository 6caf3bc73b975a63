"""This project's neural config against OpenSpiel's neural methods, one system at a time, in one
invocation: exact exploitability against wall seconds.

- **ours**: `psro run --config configs/leduc_neural.yaml` (neural CFR through the flow, Ray and
  MLflow, as a user runs it), its clock started when the command is launched, so the Prefect
  server, Ray, the MLflow store and every round's commit are inside it. It is stopped by SIGTERM
  at the budget (a clean stop). What it holds at a time is the last round's members measured
  before it: their exact exploitability, which the run logs each round.
- **nfsp**, **deep_cfr**, **escher**: OpenSpiel 2.0.2's PyTorch implementations with their
  published settings (`benchmarks/neural_peers.py` says which, and what differs), each in a
  fresh process; each is measured at the marks with its clock stopped while it is (Deep CFR and
  ESCHER train their average-policy network then, which is therefore not counted).

Every system gets the same budget and the same torch threads (`--threads`, default the config's).
Printed: the exploitability each system holds at 5, 10, 20 and 30 minutes (those within the
budget), each system's own points, the load average, the package versions. The table and the
plot (exploitability against wall seconds, log scales) go to MLflow (`--tracking-uri`,
experiment `neural-vs-openspiel`) and the plot to `--plot`.

    python benchmarks/neural_vs_openspiel.py [--game leduc_poker] [--minutes 30] [--systems ours,nfsp,deep_cfr,escher]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "leduc_neural.yaml"
MARKS = (5, 10, 20, 30)  # minutes
SYSTEMS = ("ours", "nfsp", "deep_cfr", "escher")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def versions() -> str:
    names = ("torch", "open_spiel", "numpy", "prefect", "ray", "mlflow")
    return f"python {platform.python_version()}; " + "; ".join(f"{n} {metadata.version(n)}" for n in names)


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_", "PSRO_"))}


def run_ours(game: str, budget: float, threads: int, work: Path) -> list[tuple[float, float, None]]:
    """(seconds since launch, exploitability, None) of every round `psro run` measured in the budget."""
    import mlflow

    store = f"sqlite:///{work / 'ours.db'}"
    command = [str(Path(sys.executable).with_name("psro")), "run", "--config", str(CONFIG), "--game", game]
    command += ["--rounds", "100000", "--tracking-uri", store]
    config = yaml.safe_load(CONFIG.read_text())
    if threads != config.get("threads"):
        (work / "ours.yaml").write_text(yaml.safe_dump({**config, "threads": threads}))
        command[3] = str(work / "ours.yaml")
    print(f"ours: {' '.join(command)}", flush=True)
    launched = time.time()
    with (work / "ours.log").open("w") as log:
        process = subprocess.Popen(command, cwd=work, env=clean_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=300)
    client = mlflow.MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name(config["experiment"]).experiment_id])
    history = sorted(client.get_metric_history(run.info.run_id, "exploitability"), key=lambda m: m.step)
    points = [(m.timestamp / 1000 - launched, m.value, None) for m in history]
    return [point for point in points if point[0] <= budget]


def run_peer(name: str, game: str, budget: float, threads: int, work: Path) -> list[tuple[float, float, float]]:
    """(training wall seconds, exploitability, mark seconds) at the peer's marks: each measured
    once its training clock passed the mark (so a little after it, which favours the peer)."""
    out = work / f"{name}.json"
    marks = ",".join(str(m) for m in (1, 2, *MARKS))
    command = [sys.executable, str(ROOT / "benchmarks" / "neural_peers.py"), name, "--game", game]
    command += ["--minutes", str(budget / 60), "--threads", str(threads), "--marks", marks, "--json", str(out)]
    print(f"{name}: {' '.join(command)}", flush=True)
    with (work / f"{name}.log").open("w") as log:
        subprocess.run(command, cwd=ROOT, env=clean_env(), stdout=log, stderr=subprocess.STDOUT, check=True)
    curve = json.loads(out.read_text())["curve"]
    return [(point["wall_seconds"], point["exploitability"], point["mark_seconds"]) for point in curve]


def held_at(points: list[tuple], seconds: float) -> float | None:
    """The exploitability of what a system holds at `seconds`: ours, its last round measured by
    then; a peer, its measurement at that mark."""
    held = [value for at, value, mark in points if (at <= seconds + 1e-9 if mark is None else mark == seconds)]
    return held[-1] if held else None


def table(curves: dict[str, list], marks: list[float]) -> str:
    header = "| system | " + " | ".join(f"{m:g} min" for m in marks) + " | points |"
    lines = [header, "|---" * (len(marks) + 2) + "|"]
    for name, points in curves.items():
        held = [held_at(points, m * 60) for m in marks]
        cells = ["-" if v is None else f"{v:.3f}" for v in held]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {len(points)} |")
    return "\n".join(lines)


def plot(curves: dict[str, list], game: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7.5, 4.5))
    for name, points in curves.items():
        if points:
            axis.plot([p[0] for p in points], [p[1] for p in points], marker=".", lw=1.5, label=name)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("wall seconds")
    axis.set_ylabel("exact exploitability (NashConv / 2)")
    axis.set_title(f"Neural methods on {game}, one at a time on the same cores")
    axis.grid(alpha=0.3, which="both")
    axis.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def track(tracking_uri: str, args, curves: dict, text: str, plot_path: Path, context: dict) -> str:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name("neural-vs-openspiel")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("neural-vs-openspiel")
    run_id = client.create_run(experiment_id, run_name=f"{args.game}-{args.minutes:g}min").info.run_id
    for key, value in {"game": args.game, "minutes": args.minutes, "threads": args.threads, **context}.items():
        client.log_param(run_id, key, str(value)[:6000])
    for name, points in curves.items():
        for seconds, value, _ in points:
            client.log_metric(run_id, f"{name}/exploitability", value, step=int(round(seconds)))
    client.log_text(run_id, text, "neural_vs_openspiel.md")
    client.log_artifact(run_id, str(plot_path), "plots")
    client.set_terminated(run_id)
    return run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--game", default="leduc_poker")
    parser.add_argument("--minutes", type=float, default=30.0, help="each system's wall-clock budget")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--threads", type=int, default=yaml.safe_load(CONFIG.read_text())["threads"])
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument(
        "--plot", type=Path, help="where the plot goes (default docs/images/neural_vs_openspiel_GAME.png)"
    )
    args = parser.parse_args()
    systems = args.systems.split(",")
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"--systems: unknown {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    budget = args.minutes * 60
    context = {"versions": versions(), "load_at_start": load(), "cpus": os.cpu_count()}
    print(f"neural vs OpenSpiel on {args.game}: {args.minutes:g} min each, {args.threads} torch threads", flush=True)
    print(f"{context['versions']}; {os.cpu_count()} CPUs; load average {load()}", flush=True)
    curves: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="neural-bench-") as scratch:
        for name in systems:
            work = Path(scratch) / name
            work.mkdir()
            started = time.perf_counter()
            if name == "ours":
                curves[name] = run_ours(args.game, budget, args.threads, work)
            else:
                curves[name] = run_peer(name, args.game, budget, args.threads, work)
            points = "  ".join(f"{p[0]:.0f}s {p[1]:.3f}" for p in curves[name])
            print(f"{name}: {time.perf_counter() - started:.0f} s; load average {load()}; {points}", flush=True)
    marks = [m for m in MARKS if m <= args.minutes] or [args.minutes]
    text = table(curves, marks)
    ours = curves.get("ours")
    if ours:
        ahead = [
            all(
                held_at(ours, m * 60) is not None
                and (held_at(points, m * 60) is None or held_at(ours, m * 60) < held_at(points, m * 60))
                for name, points in curves.items()
                if name != "ours"
            )
            for m in marks
        ]
        text += "\n\nours ahead of every peer at: " + (
            ", ".join(f"{m:g} min" for m, a in zip(marks, ahead) if a) or "none"
        )
    text += f"\n\n{context['versions']}; load average at start {context['load_at_start']}, at end {load()}"
    print(text, flush=True)
    slug = re.sub(r"[^A-Za-z0-9]+", "_", args.game).strip("_")
    plot_path = args.plot or ROOT / "docs" / "images" / f"neural_vs_openspiel_{slug}.png"
    plot(curves, args.game, plot_path)
    run_id = track(args.tracking_uri, args, curves, text, plot_path, context)
    print(f"plot: {plot_path}; MLflow run {run_id} in {args.tracking_uri}", flush=True)


if __name__ == "__main__":
    main()
