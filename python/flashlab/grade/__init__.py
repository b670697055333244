"""The course labs' grader (notebooks/labs): ``flashlab-grade LAB SUBMISSION``.

    report = grade("01", "softmax.py")   # runs the lab's checks on the file, in a worker process
    print(report)                        # per check: points, what was wrong, the hint for it
    report.write_json("results.json")    # the results.json autograding services accept

Each check either passes (its points) or fails with a message naming the shape, the mask and
what differed, and the hint written for that mistake; a check that cannot run on this machine
(lab 06's GPU checks where there is no GPU) is reported NOT RUN, with 0 points. The submission
runs in a process of its own under a time and a memory limit: one that never ends or allocates
without bound loses the checks it had not finished, and the grader reports why. ``release(labs_dir, out_dir)`` writes the
student version of the labs, without their solutions/ and instructor pages.
"""

from ._framework import Check, Failure, Lab, NotRun, Report, TestResult, find_lab, grade, labs, release

__all__ = ["Check", "Failure", "Lab", "NotRun", "Report", "TestResult", "find_lab", "grade", "labs", "release"]
