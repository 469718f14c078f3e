"""The docs: what `mkdocs build --strict` (CI, docs/howto/docs.md) does not check.

README.md stays short, keeps the quick start's two commands word for word (CI runs the
second) and links only to files that exist; the generated reference pages list every field
of the spec dataclasses and of the step record. The hook that generates them
(docs/hooks/reference.py) imports no mkdocs, so none of this needs mkdocs installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
HOOK = ROOT / "docs" / "hooks" / "reference.py"
QUICK_START = (
    "pip install -e . -c constraints.txt && hetbench run",
    "pip install -e '.[test,all]' -c constraints.txt && pytest -q",
)
SPEC_TYPES = {"SuiteSpec", "RunSpec", "WorkerSpec", "PartitionSpec", "TargetSpec",
              "AggregatorSpec", "OptimizerSpec", "LoaderSpec", "PipelineSpec"}
# [text](target): the target up to a space (a title) or the closing parenthesis
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s[^)]*)?\)")


@pytest.fixture(scope="module")
def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hetbench_docs_reference", HOOK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as mkdocs loads hooks
    spec.loader.exec_module(module)
    return module


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub and mkdocs' toc make it (for the headings used here)."""
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"[-\s]+", "-", text).strip("-")


def _anchors(markdown: str) -> set[str]:
    body = re.sub(r"```.*?```", "", markdown, flags=re.S)  # a `# comment` is no heading
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", body, re.M)}


def test_the_readme_is_at_most_12_kb_and_keeps_the_quick_start_verbatim() -> None:
    text = README.read_text()
    assert len(README.read_bytes()) <= 12 * 1024
    for command in QUICK_START:
        assert f"```sh\n{command}\n```" in text, command
    # .ci/run runs exactly the README's test command
    assert QUICK_START[1] in (ROOT / ".ci" / "run").read_text()


def test_every_relative_link_of_the_readme_leads_to_a_file_and_heading_that_exist() -> None:
    text = README.read_text()
    links = [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]
    assert links, "the README links into the docs"
    for target in links:
        path, _, anchor = target.partition("#")
        file = (README.parent / path).resolve() if path else README
        assert file.is_file(), f"README.md links to {target}: no such file"
        assert file.is_relative_to(ROOT), target
        if anchor and file.suffix == ".md":
            assert anchor in _anchors(file.read_text()), f"README.md: no heading #{anchor}"


def test_the_suite_key_reference_lists_every_field_of_every_spec_type(hook: ModuleType) -> None:
    sections = hook.suite_key_sections()
    assert SPEC_TYPES <= {s.spec.__name__ for s in sections}
    for section in sections:
        listed = re.findall(r"^\| `([^`]+)` \|", hook.section_markdown(section), re.M)
        fields = [f.name for f in dataclasses.fields(section.spec)]
        assert fields == listed[:len(fields)], section.spec.__name__  # in the code's order
        assert set(section.keys) <= set(listed), section.spec.__name__  # and every suite key
    # each section's heading is in the page's text, so links to #partition and so on hold
    page = hook.suite_keys_markdown()
    for section in sections:
        assert f"### {section.title}\n" in page


def test_the_results_reference_lists_every_record_field_and_file(hook: ModuleType) -> None:
    text = hook.results_markdown()
    names = hook.collector.RECORD_DTYPE.names
    assert [n for n, _ in hook.record_fields()] == list(names)
    for name in names:
        assert f"| `{name}` |" in text
    for module, constant, _ in hook.FILE_CONSTANTS:
        assert f"`{getattr(module, constant)}`" in text


def test_the_cli_reference_has_every_subcommand(hook: ModuleType) -> None:
    commands = getattr(hook.cli_main, "SUBCOMMANDS", None) or hook.cli_main.COMMANDS
    text = hook.cli_markdown()
    for name in commands:
        assert f"## hetbench {name}\n" in text
        assert f"usage: hetbench {name}" in text


def test_every_page_holding_a_marker_is_in_the_docs_and_every_marker_is_held(
        hook: ModuleType) -> None:
    held = {m for page in hook.pages() for m in hook.held(page.read_text())}
    assert held == set(hook.MARKERS)


def test_the_reference_pages_hold_in_the_repository_what_the_code_generates(
        hook: ModuleType) -> None:
    """The tables are committed (a reader of the checkout or the forge sees the contract,
    not a marker); a page the code no longer matches fails here and in the site's build."""
    for page in hook.pages():
        assert hook.stale(page.read_text()) == [], \
            f"{page.relative_to(ROOT)}: out of date: run `{hook.REGENERATE}`"
    job = (ROOT / "docs" / "reference" / "job.md").read_text()
    assert "| `model` | `torch.nn.Module` | required |" in job
    assert hook.stale(job.replace("| `model` |", "| `model_` |")) == ["<!-- hetbench:job -->"]
    loop = (ROOT / "docs" / "reference" / "loop.md").read_text()
    for documented in ("Session.rank: int", "Session.world_size: int", "Session.is_main: bool",
                       "Session.backward(loss: torch.Tensor) -> None"):
        assert documented in loop
    # a marker quoted in a sentence holds nothing
    assert hook.held("the marker `<!-- hetbench:job -->` in a sentence") == []
