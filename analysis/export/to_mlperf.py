"""A run with held-out evaluations as an MLPerf-style training log: `:::MLLOG` lines written
by the mlperf-logging package's own logger, in the order MLPerf's rules ask for
(training ruleset 6.0.0, common rules), so that its parser and compliance checker read it.

- the submission keys name hetbench's run: division `open`, the workload as the benchmark
  (not one of MLPerf's, so the checker's benchmark-specific rules do not apply), the
  devices as the platform; `cache_clear` is false: hetbench does not drop the page cache;
- `init_start` and `init_stop`/`run_start` at the run's start (its manifest);
- per evaluation, the block of training since the last one ended (`block_start` there,
  `block_stop` as the evaluation begins, samples counted; none before an evaluation at
  step 0, when nothing was trained), then `eval_start`,
  `eval_accuracy` (the target's metric, loss or the workload's accuracy), `eval_stop`;
- `run_stop` after the first evaluation that reaches the target (`status` success), else
  after the last (`status` aborted), as MLPerf stops a run at its target.

Times: milliseconds since the epoch, the run's start plus each evaluation's wall seconds
from the first step (so they leave out the time before it, the workers' start-up). Each
line's `file` is hetbench's module that logged it, relative to the installed package (as
MLPerf's reference implementations log theirs), not a path on this machine.

MLPerf's checker chains its common rules to the division's and the benchmark's
(`open_<benchmark>.yaml`), which name MLPerf's own benchmarks, not hetbench's workloads:
`rules_file` writes the common rules without that chaining beside the logs, and the
checker reads them with `--config` (`checker_command`), as `hetbench export` runs it.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from hetbench.analysis.tables.convergence import metric_column, time_to_target

RULESET = "6.0.0"
# the common rules, without their chaining to MLPerf's divisions and benchmarks
RULES_FILE = f"mlperf-training-{RULESET}-common.yaml"
CHECKER_LOG = "compliance_checker.log"  # what the checker run by checker_command writes
# what each line's `file` is relative to: the folder holding the hetbench package (not
# resolved: in a checkout hetbench/analysis is a link, and the module is imported through it)
_PACKAGE_ROOT = Path(__file__).parents[3]


def export(manifest: dict[str, Any], evals: pd.DataFrame, path: Path) -> bool:
    """Write the log to `path`; False (nothing written) for a run without evaluations."""
    if evals.empty:
        return False
    import logging

    from mlperf_logging.mllog import constants as c
    from mlperf_logging.mllog.mllog import MLLogger

    run = manifest.get("run", {})
    target = run.get("target") or {}
    metric = target.get("metric") or metric_column(evals) or "loss"
    ordered = evals.sort_values("step")
    reached = _reached(ordered, metric, target.get("value"))
    shown = ordered if reached is None else ordered.loc[:reached]
    start_ms = _start_ms(manifest)
    logger = logging.getLogger(f"hetbench.mllog.{path}")  # one per file: no shared handlers
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.FileHandler(path, mode="w")
    logger.addHandler(handler)
    try:
        log = MLLogger(logger=logger, root_dir=str(_PACKAGE_ROOT))
        workers = run.get("workers") or []
        for key, value in ((c.SUBMISSION_ORG, "hetbench"),
                           (c.SUBMISSION_PLATFORM, _platform(workers)),
                           (c.SUBMISSION_DIVISION, c.OPEN),
                           (c.SUBMISSION_STATUS, c.RESEARCH),
                           (c.SUBMISSION_BENCHMARK, str(run.get("workload", "?"))),
                           (c.CACHE_CLEAR, False),
                           (c.GLOBAL_BATCH_SIZE, int(run.get("global_batch", 0))),
                           (c.OPT_BASE_LR, float(run.get("lr", 0.0))),
                           (c.SEED, int(run.get("seed", 0))),
                           (c.TRAIN_SAMPLES, int(ordered["samples"].max())),
                           (c.EVAL_SAMPLES, int(ordered["heldout_samples"].iloc[0]))):
            log.event(key=key, value=value, time_ms=start_ms)
        log.start(key=c.INIT_START, time_ms=start_ms)
        log.end(key=c.INIT_STOP, time_ms=start_ms)
        log.start(key=c.RUN_START, time_ms=start_ms)
        before, since = 0, start_ms
        for row in shown.itertuples(index=False):
            at = start_ms + int(float(row.wall_s) * 1000)
            samples = {"samples_count": int(row.samples)}
            if int(row.samples) > before:  # not before training (an evaluation at step 0)
                log.start(key=c.BLOCK_START, time_ms=min(since, at),
                          metadata={"samples_count": before})
                log.end(key=c.BLOCK_STOP, time_ms=at, metadata=samples)
            log.start(key=c.EVAL_START, time_ms=at, metadata=samples)
            log.event(key=c.EVAL_ACCURACY, value=float(getattr(row, metric)), time_ms=at,
                      metadata={**samples, "metric": metric, "step": int(row.step)})
            since = at + int(float(row.eval_s) * 1000)
            log.end(key=c.EVAL_STOP, time_ms=since, metadata=samples)
            before = int(row.samples)
        last = shown.iloc[-1]
        log.end(key=c.RUN_STOP,
                time_ms=start_ms + int((float(last["wall_s"]) + float(last["eval_s"])) * 1000),
                metadata={"status": c.SUCCESS if reached is not None else c.ABORTED,
                          "samples_count": int(last["samples"])})
    finally:
        logger.removeHandler(handler)
        handler.close()
    return True


def _reached(evals: pd.DataFrame, metric: str, value: Any) -> Any:
    """The index of the first evaluation at the target (hetbench.analysis.tables.convergence's
    reading), None without a target or when no evaluation reaches it."""
    if value is None:
        return None
    step = time_to_target(evals, metric, float(value))["steps_to_target"]
    return None if step != step else evals.index[evals["step"] == step][0]


def _platform(workers: list[dict[str, Any]]) -> str:
    """'2 x cpu' or 'cpu + cuda:0': the run's devices."""
    devices = [str(w.get("device", "cpu")) for w in workers] or ["cpu"]
    return f"{len(devices)} x {devices[0]}" if len(set(devices)) == 1 else " + ".join(devices)


def _start_ms(manifest: dict[str, Any]) -> int:
    start = manifest.get("start")
    return int(datetime.fromisoformat(start).timestamp() * 1000) if start else 0


def rules_file(folder: Path) -> Path:
    """The checker's common rules of the training ruleset, without the chaining to the
    division's and the benchmark's rules (MLPerf's own benchmarks, not hetbench's
    workloads), written into `folder`; every other check kept as it is."""
    import yaml
    from mlperf_logging.compliance_checker import mlp_compliance

    path = folder / RULES_FILE  # written afresh: the installed checker's rules, not a kept copy
    shipped = Path(mlp_compliance.__file__).parent / f"training_{RULESET}" / "common.yaml"
    rules = yaml.safe_load(shipped.read_text())
    for rule in rules:  # keep the rest of what a rule does after its checks
        if "enqueue_config" in str(rule.get("KEY", {}).get("POST", "")):
            rule["KEY"]["POST"] = "; ".join(
                part for part in rule["KEY"]["POST"].split(";") if "enqueue_config" not in part)
    path.write_text(f"# {shipped.name} of mlperf-logging's training_{RULESET} rules, without "
                    "the chaining to\n# MLPerf's divisions and benchmarks (hetbench export)\n"
                    + yaml.safe_dump(rules))
    return path


def checker_command(log: Path, rules: Path) -> list[str]:
    """MLPerf's compliance checker on `log` with hetbench's `rules` (rules_file), its own
    log beside them (by default it writes compliance_checker.log where it is run)."""
    return ["python", "-m", "mlperf_logging.compliance_checker", "--usage", "training",
            "--ruleset", RULESET, "--config", str(rules),
            "--log_output", str(rules.parent / CHECKER_LOG), str(log)]


def check(path: Path, rules: Path) -> list[str]:
    """MLPerf's compliance checker on the log, with `rules` (rules_file): every key, order,
    count and value the training ruleset's common rules ask for. Returns the checker's
    messages: none when the log passes."""
    import logging

    from mlperf_logging.compliance_checker import mlp_compliance

    checker = mlp_compliance.make_checker("training", RULESET, quiet=True, werror=False)
    logging.disable(logging.WARNING)  # the checker logs to the root logger: said below
    try:
        checker.check_file(str(path), str(rules))
    finally:
        logging.disable(logging.NOTSET)
    return [*checker.warnings.values(), *checker.overwritable.values(),
            *checker.not_overwritable]
