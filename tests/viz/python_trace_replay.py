"""The visualizer replays a trace recorded by a schedule written in Python as it replays the C++
schedule's: FA2's forward in Python (flashlab/examples/fa2_forward.py) and the C++ fa2 are traced
on the same problem, and flashlab_viz draws both headless at the same position; the two
screenshots must be the same image, and each replay must succeed.

    python3 python_trace_replay.py APP XVFB_RUN OUT_DIR    (PYTHONPATH: the build's python/)
"""
import pathlib
import subprocess
import sys

from flashlab import schedules, sim
from flashlab.examples.fa2_forward import fa2_forward


def replay(app: str, xvfb_run: str, trace: pathlib.Path, screenshot: pathlib.Path) -> bytes:
    command = [xvfb_run, "-a", app, "--trace", str(trace), "--screenshot", str(screenshot), "--position", "0.55"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0 or not screenshot.is_file():
        sys.exit(f"{' '.join(command)}: exit {result.returncode}\n{result.stdout}{result.stderr}")
    return screenshot.read_bytes()


def main() -> None:
    app, xvfb_run, out = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    problem = sim.problem(seqlen_q=160, seqlen_k=200, head_dim=32, causal=True)
    python_trace, cpp_trace = out / "fa2_python.json", out / "fa2_cpp.json"
    schedules.trace(fa2_forward, problem, block_rows=32, block_cols=48, sram="48K", name="fa2", path=python_trace)
    sim.trace("fa2", problem, blocks=(32, 48), sram="48K", path=cpp_trace)
    python_image = replay(app, xvfb_run, python_trace, out / "fa2_python.png")
    cpp_image = replay(app, xvfb_run, cpp_trace, out / "fa2_cpp.png")
    if python_image != cpp_image:
        sys.exit(f"the replays differ: {out / 'fa2_python.png'} and {out / 'fa2_cpp.png'}")
    print(f"the Python FA2's trace replays as the C++ fa2's: {out / 'fa2_python.png'}")


if __name__ == "__main__":
    main()
