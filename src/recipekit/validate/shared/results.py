"""What a check produces: a :class:`Result` per check, each holding the :class:`Finding` s that failed it.

A finding names the bundle file and the field inside it (``volcano-job.yaml spec.tasks[0].minAvailable``), so a
failure points at the line to fix. A check that cannot run here (a linter not installed, a library missing) is
*skipped with a reason*, never silently passed. The :class:`Verdict` turns results into the exit code and the
``--json`` document.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skipped"


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing wrong: the bundle file, the field inside it (dotted / indexed path, may be empty), what, and how
    to fix it."""

    file: str
    field: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        where = f"{self.file} {self.field}" if self.field else self.file
        text = f"{where}: {self.message}"
        return f"{text} ({self.hint})" if self.hint else text

    def to_json(self) -> dict[str, str]:
        return {"file": self.file, "field": self.field, "message": self.message, "hint": self.hint}


@dataclass
class Result:
    """The outcome of one check. ``details`` carries figures (dry-run metrics) for the report and ``--json``."""

    id: str
    title: str
    status: Status = Status.PASS
    findings: list[Finding] = field(default_factory=list)
    reason: str = ""  # why skipped, or a one-line summary of what was checked
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status is Status.FAIL

    def fail(self, file: str, field_: str, message: str, hint: str = "") -> None:
        self.findings.append(Finding(file, field_, message, hint))
        self.status = Status.FAIL

    def fail_all(self, findings: Iterable[Finding]) -> None:
        """Fail with each of ``findings`` (none: the result keeps its status)."""
        for finding in findings:
            self.fail(finding.file, finding.field, finding.message, finding.hint)

    def skip(self, reason: str) -> Result:
        self.status, self.reason = Status.SKIP, reason
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status.value,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "findings": [f.to_json() for f in self.findings],
            "details": self.details,
        }


@dataclass
class Verdict:
    """Every result of one ``recipekit validate`` run, and the verdict they add up to (its exit code)."""

    bundle: str
    results: list[Result] = field(default_factory=list)
    #: What the verdict adds even when every check passes (a bundle predicted not to fit, built with --allow-oom).
    warnings: list[str] = field(default_factory=list)

    def extend(self, results: list[Result]) -> None:
        self.results.extend(results)

    def counts(self) -> dict[str, int]:
        counts = {s.value: 0 for s in Status}
        for result in self.results:
            counts[result.status.value] += 1
        return counts

    @property
    def ok(self) -> bool:
        return not any(r.failed for r in self.results)

    @property
    def not_run(self) -> list[str]:
        """The checks that did not run (skipped, each with its reason): what "bundle OK" does not vouch for."""
        return [r.id for r in self.results if r.status is Status.SKIP]

    def summary(self) -> str:
        """The verdict line: the counts, then OK only for the checks that ran, naming those that did not."""
        counts = self.counts()
        line = f"{counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped: "
        if not self.ok:
            return line + "bundle has problems"
        if not self.not_run:
            return line + "bundle OK"
        return line + f"bundle OK in the {counts['pass']} checks that ran; not run: {', '.join(self.not_run)}"

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        return {
            "bundle": self.bundle,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "summary": self.counts(),
            "not_run": self.not_run,
            "warnings": list(self.warnings),
            "checks": [r.to_json() for r in self.results],
        }
