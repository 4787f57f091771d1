"""Docs that are generated from code must match it."""

from pathlib import Path

from truestep.config.reference import markdown

ROOT = Path(__file__).resolve().parents[1]


def test_config_reference_is_current() -> None:
    assert (ROOT / "docs" / "config.md").read_text() == markdown(), (
        "docs/config.md is stale: run `truestep config --reference > docs/config.md`"
    )


def test_readme_commands_match_makefile_and_ci() -> None:
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "```bash\nmake demo\n```" in readme and "```bash\nmake test\n```" in readme
    assert "\ndemo: setup" in makefile and "\ntest: lint" in makefile
    assert "make test" in ci
