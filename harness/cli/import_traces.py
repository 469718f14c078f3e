"""`hetbench import TRACES --global-batch N`: a job's torch.profiler traces (one file per
rank, as HTA reads them) as a run directory, so that `hetbench report`, `simulate` and
`advise` look at a job hetbench never ran. What a trace gives and what it cannot:
hetbench.harness.records.kineto."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hetbench.harness.cli import arguments
from hetbench.harness.partition.policies import equal_sizes
from hetbench.harness.records import kineto, rundir
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import valid_name
from hetbench.harness.spec.partitions import PartitionSpec
from hetbench.harness.spec.suite import RunSpec
from hetbench.harness.spec.workers import WorkerSpec

MOST = 2 ** 31 - 1  # samples of a step, steps: what a run's records hold (int32)
MOST_PARAMETERS = 2 ** 53  # elements exchanged: exact as the float the manifest reads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("traces", type=Path, help="folder of the job's torch.profiler "
                        "traces, one per rank (*.json or *.json.gz with distributedInfo)")
    parser.add_argument("--global-batch", type=int, required=True,
                        help="the samples of one step over all ranks (a trace has no batch "
                        "size)")
    parser.add_argument("--sizes", help="each rank's slice, comma-separated (default: "
                        "equal slices of the global batch)")
    parser.add_argument("--device", default="cpu",
                        help="the ranks' device kind as the job ran them: cpu or cuda "
                        "(default cpu)")
    parser.add_argument("--parameters", type=int,
                        help="the elements one step exchanges (the model's trained "
                        "parameters; default: read from the all-reduce calls' shapes where "
                        "the traces recorded them, record_shapes=True); simulate needs it")
    parser.add_argument("--warmup-steps", type=int, default=1,
                        help="profiled steps left out of the summaries (default 1)")
    parser.add_argument("--suite", default="imported", help="the suite's folder in --out "
                        "(default: imported)")
    parser.add_argument("--run", help="the run's name (default: the traces' folder name)")
    parser.add_argument("--out", type=arguments.folder, default=Path("results"),
                        help="results folder (default: results/)")


def slice_sizes(raw: str | None, global_batch: int, world: int) -> tuple[int, ...]:
    if global_batch < world:
        raise UsageError("--global-batch", f"{global_batch}: at least one sample for each "
                         f"of the {world} ranks")
    if raw is None:
        return equal_sizes(global_batch, world)
    try:
        sizes = tuple(int(s) for s in raw.split(","))
    except ValueError:
        raise UsageError("--sizes", f"{raw!r}: whole numbers, comma-separated") from None
    if len(sizes) != world or sum(sizes) != global_batch or min(sizes) < 1:
        raise UsageError("--sizes", f"{raw!r}: {world} slices of at least 1 adding up to "
                         f"--global-batch {global_batch}")
    return sizes


def run(args: argparse.Namespace) -> int:
    arguments.check_bounds(args.global_batch, "--global-batch", 1, MOST)
    arguments.check_bounds(args.parameters, "--parameters", 1, MOST_PARAMETERS)
    arguments.check_bounds(args.warmup_steps, "--warmup-steps", 0, MOST)
    if args.device not in ("cpu", "cuda"):
        raise UsageError("--device", f"{args.device!r}: allowed: cpu, cuda")
    name = valid_name(args.run or args.traces.resolve().name, "--run")
    valid_name(args.suite, "--suite")
    traces = kineto.read_job(args.traces)
    world = len(traces)
    sizes = slice_sizes(args.sizes, args.global_batch, world)
    rows, partial, numbers = kineto.records(traces, sizes)
    steps = len(numbers)
    if steps == 0:
        raise UsageError(str(args.traces), "no profiled step (ProfilerStep#N) with an "
                         "all-reduce on every rank")
    if not 0 <= args.warmup_steps < steps:
        raise UsageError("--warmup-steps", f"{args.warmup_steps}: below the {steps} steps "
                         "imported")
    devices = [args.device if args.device == "cpu" else f"cuda:{r}" for r in range(world)]
    spec = RunSpec(
        name=name, framework="pytorch", workload=args.traces.resolve().name,
        dataset=kineto.IMPORTED_DATASET, steps=steps, warmup_steps=args.warmup_steps,
        global_batch=args.global_batch, lr=0.0, seed=0,
        partition=PartitionSpec(policy="sizes", sizes=sizes) if args.sizes else PartitionSpec(),
        workers=tuple(WorkerSpec(device=d) for d in devices), keep_freed_memory=False)
    out = args.out
    repeat = rundir.next_repeat(out / args.suite, spec.name)
    run_dir = rundir.prepare_run_dir(out, args.suite, spec, repeat)
    hosts = sorted({t.host for t in traces})
    parameters = args.parameters or kineto.exchanged_per_step(
        traces[0], kineto.steps_of(traces[0]))
    infos = [{"rank": t.rank, "host": t.host, "label": f"rank{t.rank}",
              "device": devices[t.rank], "clock_domain": "trace", "trace": str(t.path),
              **({"parameters": parameters} if parameters else {})} for t in traces]
    imported = {"traces": str(args.traces.resolve()), "steps": numbers,
                "partial_steps": partial, "hosts": hosts, "not_in_trace": kineto.NOT_IN_TRACE,
                "clock": "one host's clock" if len(hosts) == 1 else
                "the hosts' own clocks, as synchronised as they were: idle across hosts "
                "holds their offset"}
    rundir.complete(run_dir, [rows[rows["rank"] == r] for r in range(world)], infos, None,
                    {"start": None, "end": None}, traces[0].backend or "gloo",
                    {"imported": imported, "partition_history": [
                        {"step": numbers[0], "sizes": list(sizes), "reason": "as imported"}]})
    print(f"imported {steps} step(s) of {world} rank(s) from {args.traces} -> {run_dir}"
          + (f" ({len(partial)} step(s) some rank did not record, left out)" if partial
             else ""))
    print(f"not in a trace: {', '.join(kineto.NOT_IN_TRACE)}", file=sys.stderr)
    return 0
