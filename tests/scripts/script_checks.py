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


def expect_refusals(name, common, cases, folder, kept=()):
    """Each case (extra arguments, text) refused by the script run with `common` + extra, and no
    file written to `folder` but those in `kept`; prints how many."""
    for extra, text in cases:
        expect_refusal(run_script(name, *common, *extra), text)
    written = sorted(p.name for p in pathlib.Path(folder).iterdir() if p not in kept)
    assert not written, f"files written: {written}"
    print(f"{name}: {len(cases)} refusals, each exit 2 with one line naming its input")
