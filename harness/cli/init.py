"""`hetbench init FACTORY`: a starter suite for a user's own job, as `asv quickstart` writes
a starter configuration. The factory is made and checked first (in a process of its own:
harness/run/jobcheck.py), so a suite is written only for a job that runs; the suite is then
read back by the suite loader, as `hetbench run` will read it."""

from __future__ import annotations

import argparse
from pathlib import Path

from hetbench.harness.run.jobcheck import check_job
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.suite import load_suite
from hetbench.workloads.job import JobError, parse_reference

DEFAULT_FILE = "hetbench.toml"
DEFAULT_BATCH = 64
DEFAULT_STEPS = 60
SLOWDOWN = 3.0  # the emulated slower device: three times slower than its peer

TEMPLATE = """\
# Written by `hetbench init {factory}`. A pair of workers on this machine's CPU: alike,
# then one emulating a device {slowdown:g} times slower, its slice of each global batch
# equal, sized by profiling each worker, and adapted as the run goes. Run it with
# `hetbench run {file}`, then `hetbench report results/{name}`.
[suite]
name = "{name}"
repeats = 1
description = "{factory}: a homogeneous pair, and a pair with one worker {slowdown:g}x slower"

[defaults]
workload = "{factory}"  # imported from this file's folder (`project` names another)
steps = {steps}
warmup_steps = {warmup}
global_batch = {batch}
lr = 0.05  # on the global batch's mean gradient, whatever the loss's reduction
{evaluation}
[[runs]]
name = "homogeneous"
workers = [ {{ device = "cpu" }}, {{ device = "cpu" }} ]

[[runs]]
name = "hetero-equal"
workers = [ {{ device = "cpu" }}, {{ device = "cpu", slowdown = {slowdown} }} ]

[[runs]]
name = "hetero-profiled"
partition = {{ policy = "profiled" }}
workers = [ {{ device = "cpu" }}, {{ device = "cpu", slowdown = {slowdown} }} ]

[[runs]]
name = "hetero-adaptive"
partition = {{ policy = "model", every = 5{min_slice} }}
workers = [ {{ device = "cpu" }}, {{ device = "cpu", slowdown = {slowdown} }} ]
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("factory", help="the function that returns your hetbench.Job: "
                        "'package.module:factory' or 'file.py:factory', from this folder")
    parser.add_argument("--file", type=Path, default=Path(DEFAULT_FILE),
                        help=f"the suite to write (default: {DEFAULT_FILE}; its folder is "
                             "where the factory is imported from)")
    parser.add_argument("--global-batch", type=int, default=DEFAULT_BATCH, metavar="N",
                        help=f"samples per step over both workers (default: {DEFAULT_BATCH}, "
                             "or the data's size if smaller)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                        help=f"steps per run (default: {DEFAULT_STEPS})")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")


def run(args: argparse.Namespace) -> int:
    try:
        parse_reference(args.factory)
    except JobError as exc:
        raise UsageError("factory", str(exc)) from None
    if args.steps < 10:
        raise UsageError("--steps", f"{args.steps} is not allowed (at least 10: warm-up and "
                         "the adaptive policy's windows)")
    if args.global_batch < 2:
        raise UsageError("--global-batch", f"{args.global_batch} is not allowed (at least 2: "
                         "a slice for each worker)")
    path: Path = args.file
    if path.exists() and not args.force:
        raise UsageError(str(path), "exists already (--force overwrites it)")
    if not path.parent.resolve().is_dir():
        raise UsageError("--file", f"{path.parent} is not a folder")
    project = str(path.parent.resolve())
    job = check_job(args.factory, project, 2, 0, "factory", timeout_s=300.0)
    batch = min(args.global_batch, int(job["train"]["samples"]))
    module = parse_reference(args.factory)[0].removesuffix(".py")
    name = "".join(c if c.isalnum() or c in "-_" else "-"
                   for c in module.replace("/", ".").split(".")[-1]).strip("-") or "job"
    evaluation = (f"eval_every = {args.steps // 2}  # the held-out metric, twice a run\n"
                  if job.get("heldout") else "")
    # BatchNorm on a slice of one sample has no statistics: the adaptive policy keeps two
    min_slice = ", min_slice = 2" if job.get("batchnorm") else ""
    text = TEMPLATE.format(factory=args.factory, file=path, name=name, steps=args.steps,
                           warmup=max(args.steps // 10, 1), batch=batch,
                           slowdown=SLOWDOWN, evaluation=evaluation, min_slice=min_slice)
    path.write_text(text)
    try:
        load_suite(str(path))  # what `hetbench run` will read
    except UsageError:
        path.unlink()
        raise
    print(f"wrote {path}: 4 runs of {job['model']} ({job['parameters']} parameters) on "
          f"{job['train']['samples']} samples, global batch {batch}\n"
          f"next: hetbench run {path}")
    return 0
