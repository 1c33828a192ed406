"""What a newcomer reads is what runs: the README's worker options, the workflows' retention, the
chaos suite's duration, the Django versions named, and `scripts/test` setting up what it needs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from django_rtq.management.commands.rtq_worker import Command as WorkerCommand
from django_rtq.workflows import chain
from tests.testapp.tasks import add

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
#: Options every Django command has; the README's table lists rtq_worker's own.
DJANGO_OPTIONS = {
    "--help",
    "--version",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
}


def test_the_readme_lists_every_rtq_worker_option():
    parser = WorkerCommand().create_parser("manage.py", "rtq_worker")
    options = {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option not in DJANGO_OPTIONS
    }
    table = set(re.findall(r"^\| `(--[a-z-]+)[` ]", README, re.MULTILINE))  # `--opt` or `--opt ARG`
    assert options - table == set(), "rtq_worker options missing from the README's table"
    assert "--give-up-after" in options


def test_the_workflows_retention_is_given_as_the_docs_say():
    docs = (ROOT / "docs" / "workflows.md").read_text()
    example = "chain(add.s(1, 1), add.s(10), retention=600)"
    assert example in docs and ".using(retention" not in docs
    assert eval(example).node()["retention"] == 600  # the docs' own line
    with pytest.raises(TypeError, match="retention"):
        chain(add.s(1, 1)).using(retention=600)  # what the docs say .using() does not take


#: "The chaos suite ... about N minutes", not in a sentence about the quick run or the browser tests.
CHAOS_DURATION = r"chaos suite(?:(?!browser|quick)[^.])*? about (\d+) (?:minutes|of them)"


def test_the_chaos_suites_duration_is_the_same_everywhere():
    mentions: dict[str, list[str]] = {}
    for path in [ROOT / "README.md", ROOT / "scripts" / "test", *sorted((ROOT / "docs").glob("*.md"))]:
        text = " ".join(path.read_text().split())
        for minutes in re.findall(CHAOS_DURATION, text):
            mentions.setdefault(minutes, []).append(path.name)
    assert {"README.md", "reliability.md", "test"} <= {name for names in mentions.values() for name in names}
    assert len(mentions) == 1, mentions


def test_the_classifiers_name_each_django_the_tests_run_on():
    with (ROOT / "pyproject.toml").open("rb") as file:
        classifiers = tomllib.load(file)["project"]["classifiers"]
    script = (ROOT / "scripts" / "test").read_text()
    versions = re.findall(r'django_spec="django>=(\d+\.\d+),', script)
    assert "6.1" in versions
    for version in versions:
        assert f"Framework :: Django :: {version}" in classifiers


# scripts/test, with a stand-in for the virtualenv's python, apt-get and the rest of PATH

FAKE_PYTHON = """\
#!/bin/sh
# Redis answers, Django's version, and pytest: print what it would run.
case "$*" in
  *--version*) echo "Python 3.11.0" ;;
  *get_version*) echo "5.2" ;;
  "-m pytest"*) shift 2; printf 'pytest:'; [ $# -gt 0 ] && printf ' [%s]' "$@"; echo ;;
esac
exit 0
"""

FAKE_APT_GET = """\
#!/bin/sh
echo "apt-get $*" >> "$APT_LOG"
case "$*" in install*) for pair in chromium:chromium faketime:faketime systemd:systemd-analyze; do
  package=${pair%%:*} command=${pair#*:}
  case "$*" in
    *"$package"*) printf '#!/bin/sh\\n' > "$FAKE_BIN/$command"; chmod +x "$FAKE_BIN/$command" ;;
  esac
done ;; esac
"""


@pytest.fixture
def run_script(tmp_path):
    """Run a copy of scripts/test in tmp_path whose virtualenv is a stand-in and whose PATH has
    only the tools the script uses (no chromium, no faketime): returns (stdout, apt-get's calls)."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "test").write_text((ROOT / "scripts" / "test").read_text())
    (tmp_path / "pyproject.toml").write_text("")
    venv_bin = tmp_path / ".venv-test" / "django5" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text(FAKE_PYTHON)
    (venv_bin / "python").chmod(0o755)
    (tmp_path / ".venv-test" / "django5" / ".installed").touch()  # newer than pyproject.toml
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "python3").write_text("#!/bin/sh\nexit 0\n")  # found, and new enough
    (fake_bin / "python3").chmod(0o755)
    for tool in ("bash", "sh", "dirname", "id", "seq", "sleep", "cat", "printf", "chmod"):
        found = subprocess.run(["which", tool], capture_output=True, text=True, check=False).stdout.strip()
        if found:
            (fake_bin / tool).symlink_to(found)
    (fake_bin / "apt-get").write_text(FAKE_APT_GET)
    (fake_bin / "apt-get").chmod(0o755)
    apt_log = tmp_path / "apt.log"

    def run(*args: str) -> tuple[str, list[str]]:
        env = {
            "PATH": str(fake_bin),
            "APT_LOG": str(apt_log),
            "FAKE_BIN": str(fake_bin),
            "HOME": str(tmp_path),
        }
        done = subprocess.run(
            [str(fake_bin / "bash"), str(tmp_path / "scripts" / "test"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        calls = apt_log.read_text().splitlines() if apt_log.exists() else []
        apt_log.unlink(missing_ok=True)
        return done.stdout, calls

    return run


def test_scripts_test_installs_chromium_faketime_and_systemd_when_missing_and_says_how_long(run_script):
    if os.geteuid() != 0:
        pytest.fail("scripts/test installs with apt-get as root; run this test as root (as CI does)")
    out, calls = run_script()
    assert calls == [
        "apt-get update -qq",
        "apt-get install -y -qq chromium",
        "apt-get update -qq",
        "apt-get install -y -qq faketime",
        "apt-get update -qq",
        "apt-get install -y -qq systemd",
    ]
    assert re.search(
        r"the whole suite takes about \d+ minutes on 2 cores \(./scripts/test --quick: about \d+\)", out
    )
    assert out.strip().splitlines()[-1] == "pytest:"

    out, calls = run_script()  # installed now
    assert calls == []


def test_scripts_test_quick_runs_neither_chaos_nor_browser_and_installs_no_browser(run_script):
    out, calls = run_script("--quick", "--", "-x")
    # the clock tests and the deploy recipes' tests run in the quick form too
    assert calls == [
        "apt-get update -qq",
        "apt-get install -y -qq faketime",
        "apt-get update -qq",
        "apt-get install -y -qq systemd",
    ]
    assert out.strip().splitlines()[-1] == "pytest: [-m] [not chaos and not browser] [-x]"
    assert re.search(r"the quick run: no chaos suite, no browser tests \(about \d+ minutes on 2 cores\)", out)


def test_scripts_test_installs_only_for_the_tests_it_runs(run_script):
    out, calls = run_script("--", "tests/test_registry.py")
    assert calls == [] and "takes about" not in out
    out, calls = run_script("--", "tests/test_clocks.py::test_x")
    assert calls == ["apt-get update -qq", "apt-get install -y -qq faketime"]


def test_the_quick_form_deselects_exactly_the_chaos_and_browser_tests():
    def collected(*args: str) -> set[str]:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        return {line.split("::")[0] for line in done.stdout.splitlines() if "::" in line}

    quick = collected(
        "-m",
        "not chaos and not browser",
        "tests/test_admin_browser.py",
        "tests/chaos",
        "tests/test_registry.py",
    )
    assert quick == {"tests/test_registry.py"}
