"""The fault-and-bad-input campaign as the tests try it (issue 30): how many faults a run
survives, bad inputs hetbench refuses and damaged results it names, out of the cases tried,
optionally under the conditions that once broke the fault tests.

    python benchmarks/fault_campaign.py                    # as CI runs them
    python benchmarks/fault_campaign.py --hostile --burners 2

--hostile starts pytest the way a background job of a non-interactive shell starts
(`bash -c 'pytest ... &'`: SIGINT ignored), beside --burners processes that spin on a
core each. Each group's test files run in one pytest process; a case counts as tried
unless skipped (a framework not installed, a host without namespaces), and as survived,
refused or named when its test passed. Prints one line per group and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GROUPS = {
    "faults survived": ["tests/test_faults.py", "tests/test_isolation.py",
                        "tests/test_listeners.py"],
    "bad inputs refused": ["tests/test_bad_suites.py", "tests/test_cli_errors.py"],
    "damaged results named": ["tests/test_corrupt_results.py"],
}
TIMEOUT_S = 3600
BURN = "while True:\n    pass\n"


def run_group(files: list[str], hostile: bool, junit: Path) -> dict[str, int]:
    """pytest over `files`; the counts of its junit report."""
    def ignore_interrupts() -> None:  # what `&` in a non-interactive shell leaves a job
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "-m", "long or not long",  # the long set too (pyproject's addopts)
                    f"--junitxml={junit}", *files], cwd=REPO, timeout=TIMEOUT_S,
                   stdout=subprocess.DEVNULL, preexec_fn=ignore_interrupts if hostile else None)
    cases = ET.parse(junit).getroot().iter("testcase")
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for case in cases:
        outcome = ("skipped" if case.find("skipped") is not None else
                   "failed" if case.find("failure") is not None or case.find("error") is not None
                   else "passed")
        counts[outcome] += 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hostile", action="store_true",
                        help="pytest with SIGINT ignored, as a background job of a shell")
    parser.add_argument("--burners", type=int, default=0,
                        help="processes spinning on a core each, beside the tests")
    args = parser.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(args.burners)]
    summary: dict[str, dict[str, int]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i, (group, files) in enumerate(GROUPS.items()):
                summary[group] = run_group(files, args.hostile, Path(tmp) / f"{i}.xml")
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    for group, counts in summary.items():
        tried = counts["passed"] + counts["failed"]
        print(f"{group}: {counts['passed']} / {tried} tried ({counts['skipped']} skipped)")
    print(json.dumps({"hostile": args.hostile, "burners": args.burners, **summary}))
    return 0 if all(c["failed"] == 0 for c in summary.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
