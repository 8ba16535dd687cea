"""The checker's report for machines: one JSON object (``--json``), JUnit XML for CI (``--junit-xml``)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from procmesh._check.report import Report


def report_json(report: Report, address: str) -> str:
    """The report as one JSON object: the counts, and every check with its status and detail."""
    return json.dumps(
        {
            "address": address,
            "passed": report.count("PASS"),
            "failed": report.count("FAIL"),
            "skipped": report.count("SKIP"),
            "checks": [{"status": s, "name": n, "detail": d} for s, n, d in report.lines],
        },
        ensure_ascii=False,
    )


def junit_xml(report: Report, address: str, seconds: float) -> str:
    """The report as a JUnit XML document: one test suite, one test case per check.

    A FAIL is a ``<failure>`` whose message is the check's detail; a SKIP is ``<skipped>``; the
    format CI systems (GitLab, Jenkins, GitHub test reporters) read.
    """
    suite = ET.Element(
        "testsuite",
        name="procmesh-check-sidecar",
        tests=str(len(report.lines)),
        failures=str(report.count("FAIL")),
        errors="0",
        skipped=str(report.count("SKIP")),
        time=f"{seconds:.3f}",
    )
    ET.SubElement(ET.SubElement(suite, "properties"), "property", name="address", value=address)
    for status, name, detail in report.lines:
        case = ET.SubElement(suite, "testcase", classname=f"procmesh-check-sidecar.{address}", name=name)
        if status == "FAIL":
            ET.SubElement(case, "failure", message=detail or "failed").text = detail
        elif status == "SKIP":
            ET.SubElement(case, "skipped", message=detail)
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
