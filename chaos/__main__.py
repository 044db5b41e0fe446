"""``make chaos``: every scenario against one real Airflow; results to chaos/results/latest.*.

``PYTHONPATH=include:tests:. .venv/bin/python -m chaos [--only a,c] [--documents 300]``. The
environment (two embedded Postgres servers, the local model server, Airflow's API server,
scheduler and DAG processor) is started once in a temporary folder and stopped at the end;
each scenario empties the replayable database first. The exit status is 1 when any scenario
fails, naming it; the results are written either way.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from chaos import results
from chaos.env import ChaosEnv
from chaos.scenarios import SCENARIOS, Context, ScenarioResult, Size, run_scenario

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    parser.add_argument("--only", default="", help="comma-separated scenario keys, e.g. a,c")
    parser.add_argument("--documents", type=int, default=300, help="documents per run")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where latest.* go")
    parser.add_argument("--keep", action="store_true", help="keep the working folder")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.only.split(",") if k.strip()] or list(SCENARIOS)
    unknown = [k for k in keys if k not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; choose from {list(SCENARIOS)}")

    def log(line: str) -> None:
        print(line, flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="replayable-chaos-"))
    started = time.monotonic()
    done: list[ScenarioResult] = []
    setup_s = 0.0
    try:
        log(f"starting Postgres x2, the model server and Airflow under {workdir}")
        with ChaosEnv(workdir / "env", workdir / "corpora") as env:
            setup_s = time.monotonic() - started
            log(f"up in {setup_s:.0f} s")
            ctx = Context(env, Size(documents=args.documents), log)
            for key in keys:
                result = run_scenario(ctx, key)
                log(result.describe())
                done.append(result)
    finally:
        total_s = time.monotonic() - started
        if done:
            report = results.build(done, setup_s=setup_s, total_s=total_s, size=args.documents)
            results.write(report, args.results)
            log("\n" + results.summary(report))
            log(f"results: {args.results / 'latest.md'}")
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    failed = [r.key for r in done if not r.passed]
    if failed or len(done) < len(keys):
        print(f"chaos: scenario(s) failed: {failed or 'did not finish'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
