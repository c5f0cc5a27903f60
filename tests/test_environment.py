"""environment.yml (conda) and pyproject.toml must describe the same environment."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pyproject_packages() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = data["project"]
    names = {_name(r) for r in project["dependencies"]}
    for extra in ("book", "test"):  # the environment the README's commands create
        names |= {_name(r) for r in project["optional-dependencies"][extra]}
    return names


def _environment_yml_packages() -> set[str]:
    names = set()
    in_pip = False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        stripped = line.split("#", 1)[0].rstrip()
        if stripped.strip() == "- pip:":
            in_pip = True
            continue
        if in_pip and stripped.strip().startswith("- "):
            item = stripped.strip()[2:].strip()
            if item.startswith("-e"):
                continue
            names.add(_name(item))
    return names


def test_environment_yml_matches_pyproject():
    assert _environment_yml_packages() == _pyproject_packages()


def test_setup_pins_match_environment_yml():
    # scripts/setup.sh installs the CPU torch and the interpreter-tested triton; environment.yml must pin the same.
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    env = (ROOT / "environment.yml").read_text()
    for pin in ("torch==2.13.0", "triton==3.7.1"):
        assert pin in setup and pin in env, pin


def test_jupyter_book_is_the_last_1x():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "jupyter-book==1.0.4.post1" in data["project"]["optional-dependencies"]["book"]
    assert not any("sphinx-book-theme" in r for r in data["project"]["optional-dependencies"]["book"])


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make test" in ci
