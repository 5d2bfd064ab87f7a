"""Print the failed tests and the slowest tests of one or more JUnit XML reports (pytest's ``--junitxml``).

Usage: python .ci/slowest.py COUNT REPORT.xml [REPORT.xml ...]
Each failed or erroring test comes first with the first line of its message, so the end of CI's output (what a
reader sees first) names it. A test's time is its setup, call and teardown together, as pytest writes it; the
report's file name (without ``.xml``) names the suite, since the same test may run in two suites.
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(count: int, reports: list[str]) -> None:
    timed, failed = [], []
    for report in map(Path, reports):
        if not report.exists():
            print(f"(no report {report}: that suite did not finish)")
            continue
        for case in ET.parse(report).iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            timed.append((float(case.get("time") or 0), report.stem, name))
            for problem in (*case.iter("failure"), *case.iter("error")):
                message = (problem.get("message") or problem.text or "").strip().splitlines()
                failed.append(f"{report.stem:<9} {name}: {message[0][:300] if message else problem.tag}")
    if failed:
        print(f"Failed ({len(failed)}):")
        print("\n".join(failed))
    print(f"The {count} slowest tests (seconds, suite, test):")
    for seconds, suite, name in sorted(timed, reverse=True)[:count]:
        print(f"{seconds:8.1f}  {suite:<9} {name}")


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2:])
