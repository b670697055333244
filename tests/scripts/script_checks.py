"""What the checks of scripts/ share: run a script as a user would, and hold a refusal to the
project's rule (exit 2, one line on stderr naming the input, nothing on stdout)."""
import pathlib
import subprocess
import sys

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


def run_script(name, *args):
    return subprocess.run([sys.executable, str(SCRIPTS / name), *args], capture_output=True, text=True)


def expect_refusal(result, text):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "", result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], result.stderr
