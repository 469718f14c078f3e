"""The suites shipped inside the package (harness/spec/suites/*.toml): names and texts, read
without parsing them (the CLI lists them in --help, where nothing heavy may load)."""

from __future__ import annotations

import tomllib
from importlib import resources


def builtin_suites() -> list[str]:
    folder = resources.files("hetbench.harness.spec") / "suites"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def builtin_text(name: str) -> str:
    return (resources.files("hetbench.harness.spec") / "suites" / f"{name}.toml").read_text()


def builtin_summary(name: str) -> str:
    """Its [suite] description, or the empty string."""
    suite = tomllib.loads(builtin_text(name)).get("suite", {})
    return str(suite.get("description", ""))
