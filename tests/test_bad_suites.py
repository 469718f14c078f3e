"""Bad values are refused before anything runs (issue 18): every malformed suite below is one
line naming the field (or the file) and what is allowed. The table documents what is refused
and locks the messages; a sample of it goes through the real `hetbench run` process, which
must exit 2 without a traceback and without creating --out. No worker is ever started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hetbench.harness.cli.run import refuse_missing_devices
from hetbench.harness.spec.errors import UsageError
from hetbench.harness.spec.fields import MAX_CORE
from hetbench.harness.spec.suite import load_suite
from tests.test_cli_errors import cuda_7_missing, error_line  # noqa: F401 - a fixture

DIRECTORY = b"<a directory, not a file>"  # content marker: the suite path is a folder
FILE = "{path}"  # `where` marker: the error names the suite file itself
OUTSIDE_CORE = max(os.sched_getaffinity(0)) + 1  # a core number this host does not have


def run(*lines: str) -> str:
    """One [[runs]] table named r with `lines` (else the defaults: one CPU worker, a global
    batch of 128 from the digits data set)."""
    return "\n".join(['[[runs]]', 'name = "r"', *lines]) + "\n"


def workers(first: str = "threads = 1") -> str:
    """Two CPU workers, the first with `first` set."""
    return f'workers = [ {{ device = "cpu", {first} }}, {{ device = "cpu" }} ]'


def worker(first: str) -> str:
    return run(workers(first))


def partition(fields: str) -> str:
    return run(workers(), f"partition = {{ {fields} }}")


def adaptive(fields: str) -> str:
    return partition(f'policy = "proportional", {fields}')


def optimizer(fields: str) -> str:
    return run(f"optimizer = {{ {fields} }}")


def aggregator(fields: str) -> str:
    return run(workers(), f"aggregator = {{ {fields} }}")


def nested(depth: int) -> str:
    return "x = " + "[" * depth + "]" * depth + "\n"


# (case, suite content, field named, a fragment of the message)
CASES = [
    # -- the file itself
    ("directory", DIRECTORY, FILE, "is a directory"),
    ("empty file", "", FILE, "is empty"),
    ("blank file", "  \n\n", FILE, "is empty"),
    ("binary garbage", b"\x7fELF\x02\x01\x01\x00\x00\xff\xfe", FILE, "a binary file"),
    ("not UTF-8", b'[[runs]]\nname = "caf\xe9"\n', FILE, "not UTF-8 text (byte 0xe9"),
    ("invalid TOML", '[[runs]\nname = "r"\n', FILE, "invalid TOML"),
    ("unterminated string", '[[runs]]\nname = "r\n', FILE, "invalid TOML"),
    ("key given twice", run("steps = 2", "steps = 3"), FILE, "invalid TOML"),
    ("deep nesting", nested(5000), FILE, "nested too deeply"),
    ("integer of 5000 digits", run("steps = " + "9" * 5000), FILE, "invalid TOML"),
    # -- structure: tables where tables belong, at least one run
    ("no runs", '[suite]\nname = "s"\n', "runs", "at least one [[runs]] table"),
    ("runs not an array of tables", "runs = 3\n", "runs", "at least one [[runs]] table"),
    ("run not a table", "runs = [3]\n", "runs[0]", "must be a table, not an integer"),
    ("array for suite", "suite = [1]\n" + run(), "suite", "must be a table, not an array"),
    ("array for partition", run("partition = [1, 2]"), "runs[0].partition",
     "must be a table, not an array"),
    ("string for workers", run('workers = "cpu"'), "runs[0].workers",
     "list of 1 to 1024 worker tables"),
    ("no workers", run("workers = []"), "runs[0].workers", "list of 1 to 1024 worker tables"),
    ("too many workers", run("workers = [" + "{}, " * 1025 + "]"), "runs[0].workers",
     "list of 1 to 1024 worker tables"),
    ("worker not a table", run('workers = ["cpu"]'), "runs[0].workers[0]",
     "must be a table, not a string"),
    # -- unknown keys, at every level, listing what is allowed
    ("unknown top-level key", "bogus = 1\n" + run(), "bogus",
     "unknown key (allowed: defaults, nodes, runs, suite)"),
    ("unknown [suite] key", '[suite]\nnme = "s"\n' + run(), "suite.nme",
     "allowed: description, name, repeats"),
    ("unknown [defaults] key", "[defaults]\nstpes = 3\n" + run(), "defaults.stpes",
     "unknown key (allowed: accumulate, aggregator, args, batchnorm, calibrate"),
    ("unknown run key", run("stpes = 3"), "runs[0].stpes", "unknown key (allowed: "),
    ("unknown worker key", worker("thread = 2"), "runs[0].workers[0].thread",
     "allowed: cores, device, framework, jitter, loader_workers, node, slowdown, slowdown_at, "
     "threads"),
    ("unknown partition key", partition('policy = "equal", size = 3'), "runs[0].partition.size",
     "unknown key (allowed: "),
    ("unknown loader key", run("loader = { threads = 2 }"), "runs[0].loader.threads",
     "allowed: augment, decode, kind, pin_memory, prefetch, workers"),
    ("unknown aggregator key", aggregator('name = "ssp", stale = 2'),
     "runs[0].aggregator.stale", "unknown key (allowed: "),
    ("unknown jitter key", worker("jitter = { probability = 0.5, factor = 2.0, seed = 1 }"),
     "runs[0].workers[0].jitter.seed", "allowed: factor, probability"),
    ("unknown optimizer key", optimizer('name = "sgd", lr = 0.1'), "runs[0].optimizer.lr",
     "unknown key (allowed: "),
    ("unknown target key", run("eval_every = 5", "target = { value = 0.5, at = 3 }"),
     "runs[0].target.at", "allowed: metric, value"),
    # -- wrong types
    ("string for an integer", run('steps = "many"'), "runs[0].steps",
     "must be an integer, not a string"),
    ("float for an integer", run("global_batch = 128.0"), "runs[0].global_batch",
     "must be an integer, not a float"),
    ("bool for an integer", run("steps = true"), "runs[0].steps",
     "must be an integer, not a boolean"),
    ("date for an integer", run("steps = 1979-05-27"), "runs[0].steps",
     "must be an integer, not a date"),
    ("table for a string", run("framework = { name = 'pytorch' }"), "runs[0].framework",
     "must be a string, not a table"),
    ("string for a number", run('lr = "0.1"'), "runs[0].lr", "must be a number, not a string"),
    ("string for a bool", run('instrument = "yes"'), "runs[0].instrument",
     "must be true or false, not a string"),
    ("integer for keep_freed_memory", run("keep_freed_memory = 0"),
     "runs[0].keep_freed_memory", "must be true or false, not an integer"),
    ("float in sizes", partition('policy = "sizes", sizes = [64.0, 64]'),
     "runs[0].partition.sizes", "must be an integer, not a float"),
    ("string for cores", worker('cores = "0-3"'), "runs[0].workers[0].cores",
     "non-empty list of core numbers"),
    # -- every number: below its minimum, above its maximum, not finite
    ("repeats 0", '[suite]\nrepeats = 0\n' + run(), "suite.repeats", "0 is below the minimum 1"),
    ("repeats above 1000", '[suite]\nrepeats = 1001\n' + run(), "suite.repeats",
     "1001 is not allowed (1 to 1000)"),
    ("steps 0", run("steps = 0"), "runs[0].steps", "0 is below the minimum 1"),
    ("steps above 10 million", run("steps = 10_000_001"), "runs[0].steps",
     "10000001 is not allowed (1 to 10000000)"),
    ("steps beyond 64 bits", run("steps = 99999999999999999999999"), "runs[0].steps",
     "99999999999999999999999 is not allowed (1 to 10000000)"),
    ("steps of 40 digits", run("steps = " + "1" * 40), "runs[0].steps",
     "111111111111...(40 digits) is not allowed (1 to 10000000)"),
    ("negative warmup", run("warmup_steps = -1"), "runs[0].warmup_steps", "below the minimum 0"),
    ("warmup equal to steps", run("steps = 5", "warmup_steps = 5"), "runs[0].warmup_steps",
     "5 must be below steps (5)"),
    ("global_batch 0", run("global_batch = 0"), "runs[0].global_batch", "below the minimum 1"),
    ("global_batch above a million", run("global_batch = 1_000_001"), "runs[0].global_batch",
     "1000001 is not allowed (1 to 1000000)"),
    ("global_batch beyond the data set", run("global_batch = 2000"), "runs[0].global_batch",
     "2000 exceeds the 1500 samples of dataset 'digits'"),
    ("global_batch below the workers", run("global_batch = 1", workers()),
     "runs[0].global_batch", "1 is smaller than the number of workers (2)"),
    ("lr 0", run("lr = 0"), "runs[0].lr", "must be above 0.0"),
    ("lr above 100", run("lr = 1000.0"), "runs[0].lr",
     "1000.0 is not allowed (above 0, at most 100)"),
    ("lr nan", run("lr = nan"), "runs[0].lr", "nan is not allowed (must be a finite number)"),
    ("lr inf", run("lr = inf"), "runs[0].lr", "inf is not allowed (must be a finite number)"),
    ("seed negative", run("seed = -1"), "runs[0].seed", "below the minimum 0"),
    ("seed of 33 bits", run("seed = 4294967296"), "runs[0].seed", "(0 to 4294967295)"),
    ("timeout below 1 s", run("timeout_s = 0.5"), "runs[0].timeout_s", "at least 1.0"),
    ("timeout above a day", run("timeout_s = 86401"), "runs[0].timeout_s",
     "86401 is not allowed (1 to 86400)"),
    ("timeout -inf", run("timeout_s = -inf"), "runs[0].timeout_s", "must be a finite number"),
    ("trace window backwards", run('trace_steps = "9-3"'), "runs[0].trace_steps",
     "'9-3': a window is 'A-B', steps A to B with A <= B"),
    ("trace window not a range", run('trace_steps = "last"'), "runs[0].trace_steps",
     "or a count of the last steps (0: no trace)"),
    ("trace_steps negative", run("trace_steps = -1"), "runs[0].trace_steps",
     "-1 is below the minimum 0"),
    ("profile on tensorflow", run('framework = "tensorflow"', 'profile = { steps = "3-4" }'),
     "runs[0].profile", "torch.profiler records PyTorch workers"),
    ("profile without steps", run('profile = { ranks = "all" }'), "runs[0].profile.steps",
     "required"),
    ("profile steps a number", run("profile = { steps = 5 }"), "runs[0].profile.steps",
     'must be a string "A-B"'),
    ("profile window backwards", run('profile = { steps = "9-3" }'), "runs[0].profile.steps",
     "'9-3': a window is 'A-B'"),
    ("profile window past the run", run("steps = 30", 'profile = { steps = "25-30" }'),
     "runs[0].profile.steps", "step 30 is past the run's last step (29)"),
    ("profile window too long", run("steps = 300", 'profile = { steps = "0-100" }'),
     "runs[0].profile.steps", "101 steps is too many (at most 100"),
    ("profile leaves nothing to summarise",
     run("steps = 30", "warmup_steps = 5", 'profile = { steps = "5-29" }'),
     "runs[0].profile.steps", "leaves no step after warm-up unprofiled"),
    ("profile rank outside the world", run(workers(), 'profile = { steps = "3-4", ranks = [2] }'),
     "runs[0].profile.ranks", "2 is not allowed (0 to 1)"),
    ("profile ranks a word", run('profile = { steps = "3-4", ranks = "some" }'),
     "runs[0].profile.ranks", '"all" or a list of ranks'),
    ("profile rank twice", run(workers(), 'profile = { steps = "3-4", ranks = [1, 1] }'),
     "runs[0].profile.ranks", "names a rank twice"),
    ("profile unknown key", run('profile = { steps = "3-4", every = 2 }'),
     "runs[0].profile.every", "unknown key (allowed: ranks, steps)"),
    ("counters_every 0", run("counters_every = 0"), "runs[0].counters_every",
     "below the minimum 1"),
    ("counters_every not a number", run('counters_every = "often"'), "runs[0].counters_every",
     "integer"),
    ("calibrate_steps 0", run("calibrate_steps = 0"), "runs[0].calibrate_steps",
     "below the minimum 1"),
    ("calibrate_steps above 10 million", run("calibrate_steps = 100_000_000"),
     "runs[0].calibrate_steps", "(1 to 10000000)"),
    ("eval_every 0", run("eval_every = 0"), "runs[0].eval_every", "below the minimum 1"),
    ("eval_every above 10 million", run("eval_every = 100_000_000"), "runs[0].eval_every",
     "(1 to 10000000)"),
    ("threads 0", worker("threads = 0"), "runs[0].workers[0].threads", "below the minimum 1"),
    ("threads above 1024", worker("threads = 1025"), "runs[0].workers[0].threads",
     "1025 is not allowed (1 to 1024)"),
    ("slowdown below 1", worker("slowdown = 0.5"), "runs[0].workers[0].slowdown",
     "must be at least 1.0"),
    ("slowdown above 1e6", worker("slowdown = 2e6"), "runs[0].workers[0].slowdown",
     "2000000.0 is not allowed (1 to 1e+06)"),
    ("slowdown nan", worker("slowdown = nan"), "runs[0].workers[0].slowdown", "finite number"),
    ("slowdown inf", worker("slowdown = +inf"), "runs[0].workers[0].slowdown", "finite number"),
    ("jitter probability above 1", worker("jitter = { probability = 1.5, factor = 2.0 }"),
     "runs[0].workers[0].jitter.probability", "1.5 is not allowed (0 to 1)"),
    ("jitter factor above 1e6", worker("jitter = { probability = 0.5, factor = 5e6 }"),
     "runs[0].workers[0].jitter.factor", "5000000.0 is not allowed (1 to 1e+06)"),
    ("jitter factor nan", worker("jitter = { probability = 0.5, factor = nan }"),
     "runs[0].workers[0].jitter.factor", "finite number"),
    ("slowdown_at step negative", worker("slowdown_at = [[-1, 2.0]]"),
     "runs[0].workers[0].slowdown_at", "below the minimum 0"),
    ("slowdown_at factor above 1e6", worker("slowdown_at = [[0, 1.0], [10, 2e6]]"),
     "runs[0].workers[0].slowdown_at", "2000000.0 is not allowed (1 to 1e+06)"),
    ("profile_steps 0", partition('policy = "profiled", profile_steps = 0'),
     "runs[0].partition.profile_steps", "below the minimum 1"),
    ("profile_steps above 10 million",
     partition('policy = "profiled", profile_steps = 100_000_000'),
     "runs[0].partition.profile_steps", "(1 to 10000000)"),
    ("size negative", partition('policy = "sizes", sizes = [-1, 129]'),
     "runs[0].partition.sizes", "-1 is below the minimum 0"),
    ("size 0 with a parameter server",
     run(workers(), 'partition = { policy = "sizes", sizes = [128, 0] }',
         'aggregator = { name = "ps-sync" }'), "runs[0].partition.sizes",
     "a worker left out (an empty slice) needs an all-reduce aggregator (torch, "
     "allreduce-host), not 'ps-sync'"),
    ("leave_out with the proportional policy", adaptive("leave_out = true"),
     "runs[0].partition.leave_out", "needs policy 'model'"),
    ("leave_out not a boolean", partition('policy = "model", leave_out = 1'),
     "runs[0].partition.leave_out", "must be true or false, not an integer"),
    ("size above global_batch", partition('policy = "sizes", sizes = [200, 1]'),
     "runs[0].partition.sizes", "200 is not allowed (0 to 128)"),
    ("sizes not summing to global_batch", partition('policy = "sizes", sizes = [32, 64]'),
     "runs[0].partition.sizes", "sum 96 must equal global_batch 128"),
    ("weight 0", partition('policy = "weights", weights = [1.0, 0.0]'),
     "runs[0].partition.weights", "must be above 0.0"),
    ("weight above a million", partition('policy = "weights", weights = [1.0, 1e300]'),
     "runs[0].partition.weights", "1e+300 is not allowed (above 0, at most 1e+06)"),
    ("weight nan", partition('policy = "weights", weights = [nan, 1.0]'),
     "runs[0].partition.weights", "finite number"),
    ("every 0", adaptive("every = 0"), "runs[0].partition.every", "below the minimum 1"),
    ("every above 10 million", adaptive("every = 100_000_000"), "runs[0].partition.every",
     "(1 to 10000000)"),
    ("dead_band negative", adaptive("dead_band = -0.1"), "runs[0].partition.dead_band",
     "must be at least 0.0"),
    ("dead_band above 100", adaptive("dead_band = 1000.0"), "runs[0].partition.dead_band",
     "(0 to 100)"),
    ("max_move above 1", adaptive("max_move = 1.5"), "runs[0].partition.max_move",
     "1.5 is not allowed (above 0, at most 1)"),
    ("min_slice above global_batch", adaptive("min_slice = 129"), "runs[0].partition.min_slice",
     "129 is not allowed (1 to 128)"),
    ("min_slice for every worker above global_batch", adaptive("min_slice = 100"),
     "runs[0].partition.min_slice", "100 x 2 workers exceeds global_batch 128"),
    ("smoothing above 1", adaptive("smoothing = 1.5"), "runs[0].partition.smoothing",
     "(above 0, at most 1)"),
    ("max_ratio 1", adaptive("max_ratio = 1.0"), "runs[0].partition.max_ratio",
     "must be above 1.0"),
    ("max_ratio above 1000", adaptive("max_ratio = 1e4"), "runs[0].partition.max_ratio",
     "(above 1, at most 1000)"),
    ("reset above 100", adaptive("reset = 101.0"), "runs[0].partition.reset",
     "(above 0, at most 100)"),
    ("momentum 1", optimizer('name = "momentum", momentum = 1.0'), "runs[0].optimizer.momentum",
     "1.0 is not allowed (at least 0, below 1)"),
    ("beta2 negative", optimizer('name = "adamw", beta2 = -0.1'), "runs[0].optimizer.beta2",
     "must be at least 0.0"),
    ("eps above 1", optimizer('name = "adamw", eps = 2.0'), "runs[0].optimizer.eps",
     "(above 0, at most 1)"),
    ("weight_decay above 1", optimizer('name = "adamw", weight_decay = 5.0'),
     "runs[0].optimizer.weight_decay", "5.0 is not allowed (0 to 1)"),
    ("optimizer warm-up above steps", run("steps = 10", "optimizer = { warmup_steps = 11 }"),
     "runs[0].optimizer.warmup_steps", "11 exceeds steps (10)"),
    ("min_lr above lr", optimizer("min_lr = 0.5"), "runs[0].optimizer.min_lr",
     "0.5 is above lr (0.1)"),
    ("staleness negative", aggregator('name = "ssp", staleness = -1'),
     "runs[0].aggregator.staleness", "below the minimum 0"),
    ("staleness above 10 million", aggregator('name = "ssp", staleness = 100_000_000'),
     "runs[0].aggregator.staleness", "(0 to 10000000)"),
    ("servers above 64", aggregator('name = "ps-sync", servers = 65'),
     "runs[0].aggregator.servers", "65 is not allowed (1 to 64)"),
    ("local_steps 0", aggregator('name = "local-sgd", local_steps = 0'),
     "runs[0].aggregator.local_steps", "below the minimum 1"),
    ("ddp bucket of 0 MB", aggregator('name = "ddp", bucket_mb = 0'),
     "runs[0].aggregator.bucket_mb", "0 is not allowed (must be above 0.0)"),
    ("ddp bucket above 1 GB", aggregator('name = "ddp", bucket_mb = 2048'),
     "runs[0].aggregator.bucket_mb", "2048 is not allowed (above 0, at most 1024)"),
    ("ddp bucket not a number", aggregator('name = "ddp", bucket_mb = "big"'),
     "runs[0].aggregator.bucket_mb", "must be a number, not a string"),
    ("bucket_mb for another aggregator", aggregator('name = "torch", bucket_mb = 4'),
     "runs[0].aggregator.bucket_mb", "not an option of 'torch'"),
    ("ddp comm hook unknown", aggregator('name = "ddp", comm_hook = "fast"'),
     "runs[0].aggregator.comm_hook", "unknown 'fast' (allowed: builtin, timed)"),
    ("comm_hook for another aggregator", aggregator('name = "ps-sync", comm_hook = "timed"'),
     "runs[0].aggregator.comm_hook", "not an option of 'ps-sync'"),
    ("ddp with a TensorFlow worker", run('workers = [ { device = "cpu" }, '
                                         '{ device = "cpu", framework = "tensorflow" } ]',
                                         'aggregator = "ddp"'),
     "runs[0].aggregator", "'ddp' needs every worker on pytorch (worker 1 is tensorflow)"),
    ("ddp leaving a worker out", run(workers(), 'aggregator = "ddp"',
                                     'partition = { policy = "sizes", sizes = [0, 128] }'),
     "runs[0].partition.sizes", "needs an all-reduce aggregator"),
    ("backup workers as many as the workers", aggregator('name = "backup", backup = 2'),
     "runs[0].aggregator.backup", "2 is not allowed (0 to 1"),
    ("a worker's loader without a loader", worker("loader_workers = 0"),
     "runs[0].workers[0].loader_workers", "the run needs a `loader` table"),
    ("a worker's loader below 0", run("loader = { workers = 2 }",
                                      workers("loader_workers = -1")),
     "runs[0].workers[0].loader_workers", "below the minimum 0"),
    ("loader workers above 32", run("loader = { workers = 33 }"), "runs[0].loader.workers",
     "33 is not allowed (1 to 32)"),
    ("loader prefetch 0", run("loader = { prefetch = 0 }"), "runs[0].loader.prefetch",
     "below the minimum 1"),
    ("target accuracy above 1", run("eval_every = 5", "target = { value = 80 }"),
     "runs[0].target.value", "accuracy is 0 to 1"),
    ("target loss above a million", run("eval_every = 5",
                                        'target = { metric = "loss", value = 1e7 }'),
     "runs[0].target.value", "(0 to 1e+06)"),
    ("target nan", run("eval_every = 5", "target = { value = nan }"), "runs[0].target.value",
     "finite number"),
    # -- names: from a fixed set, or run-folder names
    ("framework", run('framework = "jax"'), "runs[0].framework",
     "unknown 'jax' (allowed: mxnet, pytorch, tensorflow)"),
    ("worker framework", worker('framework = "jax"'), "runs[0].workers[0].framework",
     "unknown 'jax'"),
    ("workload", run('workload = "resnet50"'), "runs[0].workload", "unknown 'resnet50'"),
    ("dataset", run('dataset = "mnist"'), "runs[0].dataset", "unknown 'mnist'"),
    ("dataset of another workload", run('workload = "lstm"', 'dataset = "digits"'),
     "runs[0].dataset", "'digits' does not fit workload 'lstm'"),
    ("size", run('size = "huge"'), "runs[0].size", "unknown 'huge' (allowed: base, small, tiny)"),
    ("optimizer", run('optimizer = "adam"'), "runs[0].optimizer.name",
     "unknown 'adam' (allowed: adamw, momentum, sgd)"),
    ("decay", optimizer('decay = "exp"'), "runs[0].optimizer.decay", "unknown 'exp'"),
    ("partition policy", partition('policy = "random"'), "runs[0].partition.policy",
     "unknown 'random' (allowed: equal, model"),
    ("initial partition", adaptive('initial = "random"'), "runs[0].partition.initial",
     "unknown 'random' (allowed: equal, profiled)"),
    ("aggregator", run('aggregator = "horovod"'), "runs[0].aggregator", "unknown 'horovod'"),
    ("loader kind", run('loader = { kind = "fibers" }'), "runs[0].loader.kind",
     "unknown 'fibers' (allowed: processes, threads)"),
    ("on_worker_failure", run('on_worker_failure = "retry"'), "runs[0].on_worker_failure",
     "unknown 'retry' (allowed: continue, fail)"),
    ("run name missing", "[[runs]]\nsteps = 2\n", "runs[0].name", "required"),
    ("duplicate run names", run() + run(), "runs[1].name", "'r' is used twice"),
    ("run name with a slash", run().replace('"r"', '"a/b"'), "runs[0].name",
     "'a/b' is not a name (letters, digits, '.', '_', '-')"),
    ("run name ..", run().replace('"r"', '".."'), "runs[0].name", "'..' is not a name"),
    ("run name too long", run().replace('"r"', f'"{"r" * 101}"'), "runs[0].name",
     "101 characters is too long (at most 100"),
    ("suite name too long", f'[suite]\nname = "{"s" * 200}"\n' + run(), "suite.name",
     "200 characters is too long (at most 100"),
    ("suite name with ../", '[suite]\nname = "../up"\n' + run(), "suite.name",
     "'../up' is not a name"),
    ("bad default, reported where written", "[defaults]\nsteps = -3\n" + run(),
     "defaults.steps", "below the minimum 1"),
    # -- devices and cores
    ("interface with a space", run('interface = "eth 0"'), "runs[0].interface",
     "'eth 0' is not an interface name (1 to 15 letters"),
    ("interface too long", run('interface = "a234567890123456"'), "runs[0].interface",
     "is not an interface name"),
    ("interface a number", run("interface = 0"), "runs[0].interface",
     "must be a string, not an integer"),
    ("device gpu:0", run('workers = [ { device = "gpu:0" } ]'), "runs[0].workers[0].device",
     "'gpu:0' is not a device (cpu, cuda:N)"),
    ("device with a newline", run('workers = [ { device = "cpu\\n" } ]'),
     "runs[0].workers[0].device", "is not a device"),
    ("cuda:7", run('workers = [ { device = "cuda:7" } ]'), "runs[0].workers[0].device",
     "cuda:7 not available"),
    ("empty cores", worker("cores = []"), "runs[0].workers[0].cores",
     "non-empty list of core numbers"),
    ("negative core", worker("cores = [0, -1]"), "runs[0].workers[0].cores",
     "-1 is below the minimum 0"),
    ("repeated core", worker("cores = [0, 0]"), "runs[0].workers[0].cores",
     "core 0 is listed twice"),
    ("core beyond any machine", worker("cores = [100000]"), "runs[0].workers[0].cores",
     f"100000 is not allowed (0 to {MAX_CORE})"),
    ("cores outside this host", worker(f"cores = [0, {OUTSIDE_CORE}]"),
     "runs[0].workers[0].cores", f"{OUTSIDE_CORE} not available (this host allows "),
]
# Through the real `hetbench run` process: the file problems and one of each kind of field.
CLI_CASES = {"directory", "deep nesting", "binary garbage", "not UTF-8", "empty file",
             "invalid TOML", "steps above 10 million", "lr nan", "unknown jitter key",
             "run name too long", "repeated core", "cores outside this host", "cuda:7"}


def write(folder: Path, content: str | bytes) -> Path:
    path = folder / "suite.toml"
    if content is DIRECTORY:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def needs(case: str, request: pytest.FixtureRequest) -> None:
    """Skip a case this host cannot show (it has a cuda:7, or every core there is)."""
    if case == "cuda:7":
        request.getfixturevalue("cuda_7_missing")
    if case == "cores outside this host" and OUTSIDE_CORE > MAX_CORE:
        pytest.skip("this host has every core a suite may name")


@pytest.mark.parametrize(("case", "content", "where", "fragment"), CASES,
                         ids=[c[0] for c in CASES])
def test_bad_suite_is_refused_in_one_line(tmp_path: Path, request: pytest.FixtureRequest,
                                          case: str, content: str | bytes, where: str,
                                          fragment: str) -> None:
    needs(case, request)
    path = write(tmp_path, content)
    with pytest.raises(UsageError) as info:  # what `hetbench run` checks before it starts
        refuse_missing_devices(load_suite(str(path)))
    assert info.value.where == where.format(path=path)
    assert fragment in info.value.message
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("case", "content", "where", "fragment"),
                         [c for c in CASES if c[0] in CLI_CASES],
                         ids=[c[0] for c in CASES if c[0] in CLI_CASES])
def test_hetbench_run_refuses_before_anything_runs(tmp_path: Path,
                                                   request: pytest.FixtureRequest, case: str,
                                                   content: str | bytes, where: str,
                                                   fragment: str) -> None:
    needs(case, request)
    path, out = write(tmp_path, content), tmp_path / "out"
    run = request.getfixturevalue("hetbench")  # the fixture (not shadowing the import)
    result = run(tmp_path, "run", str(path), "--out", str(out), "--no-progress")
    line = error_line(result)
    assert line.startswith(f"hetbench: error: {where.format(path=path)}: ")
    assert fragment in line
    assert result.stdout == ""
    assert not out.exists()


def test_every_cli_case_is_in_the_table() -> None:
    assert CLI_CASES <= {c[0] for c in CASES}
    assert len({c[0] for c in CASES}) == len(CASES)


# -- what kind of file the suite is (issue 30) ---------------------------------------------


def test_a_device_or_socket_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    """/dev/zero would be read to the size limit, a terminal would block: neither is opened."""
    import socket

    listening = tmp_path / "suite.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(listening))
        for path, kind in (("/dev/zero", "character device"), (str(listening), "socket")):
            with pytest.raises(UsageError) as info:
                load_suite(path)
            assert info.value.where == path
            assert info.value.message == f"is a {kind}, not a suite file (name a .toml file)"


def test_a_named_pipe_nobody_writes_to_reads_as_empty_at_once(tmp_path: Path) -> None:
    """Opening it for reading would block until a writer came (22 minutes, observed)."""
    import time

    fifo = tmp_path / "suite.fifo"
    os.mkfifo(fifo)
    began = time.monotonic()
    with pytest.raises(UsageError) as info:
        load_suite(str(fifo))
    assert "is empty" in info.value.message
    assert time.monotonic() - began < 5  # no wait for a writer (the limit is 30 s)


def test_a_pipe_is_read_to_its_end_and_a_silent_writer_waited_for_with_a_limit(
        tmp_path: Path) -> None:
    """As `hetbench run <(generate-suite)` gives it; a writer that holds the pipe open and
    never finishes is a usage error once the time is up."""
    import threading
    import time

    from hetbench.harness.spec.suite import _read_pipe

    fifo = tmp_path / "suite.fifo"
    os.mkfifo(fifo)
    text = run('workload = "mlp"', "steps = 20").encode()

    def write_slowly() -> None:
        with open(fifo, "wb") as pipe:
            for i in range(0, len(text), 7):
                pipe.write(text[i:i + 7])
                pipe.flush()

    # a reader first (as the shell's <(...) has one), so the writer's open does not block
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    writer = threading.Thread(target=write_slowly)
    writer.start()
    try:
        suite_text, deadline = b"", time.monotonic() + 10
        # empty until the writer has opened its end (no writer: end of file at once)
        while not suite_text and time.monotonic() < deadline:
            suite_text = _read_pipe(fifo, timeout_s=10)
    finally:
        writer.join(10)
        os.close(reader)
    assert suite_text == text

    held = os.open(fifo, os.O_RDWR)  # a writer that never writes nor closes
    try:
        with pytest.raises(UsageError) as info:
            _read_pipe(fifo, timeout_s=0.3)
        assert info.value.message == "a pipe whose writer did not finish within 0.3 s"
    finally:
        os.close(held)


def test_hetbench_run_refuses_an_interface_and_an_empty_out(tmp_path: Path,
                                                            request: pytest.FixtureRequest
                                                            ) -> None:
    """`interface` is what listeners bind across hosts; a single-host run would record it
    and use loopback. An empty --out would write into the current folder."""
    hetbench = request.getfixturevalue("hetbench")
    path, out = write(tmp_path, run('interface = "lo"')), tmp_path / "out"
    result = hetbench(tmp_path, "run", str(path), "--out", str(out), "--no-progress")
    assert error_line(result) == (
        "hetbench: error: runs[0].interface: 'lo' is for runs across hosts (torchrun mode, "
        "docs/howto/multi-host.md); `hetbench run` runs on this host over loopback: "
        "remove it")
    assert not out.exists()
    for command in (["run", "quick"], ["figures", str(tmp_path)]):
        result = hetbench(tmp_path, *command, "--out", "")
        assert result.returncode == 2
        assert result.stderr.splitlines()[-1].endswith(
            "error: argument --out: empty: name a folder ('.' for the current one)")
        assert list(tmp_path.iterdir()) == [tmp_path / "suite.toml"]
