"""The one shape of a problem a person must act on: what is wrong (code, message), where (field, workload) and
what to do (fix). Plan review, the conductor's run failures, ``RunFinished.reasons``, the API's 4xx bodies and the
CLI all speak it (DESIGN.md section 4)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["KvbenchError", "Problem"]


class Problem(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    code: str = Field(description="Stable machine-readable code, e.g. invalid_field, node_unresponsive")
    message: str = Field(description="What is wrong, in a sentence a person can read")
    fix: str = Field("", description="What to do about it")
    field: str = Field("", description="The plan field (dotted path) the problem is about, when there is one")
    workload: str | None = Field(None, description="The workload it is about, when there is one")

    def as_dict(self) -> dict[str, str | None]:
        """The API's and the review's form: every key, the workload first."""
        return {"workload": self.workload, "field": self.field, "code": self.code, "message": self.message,
                "fix": self.fix}  # fmt: skip

    def as_reason(self) -> dict[str, str]:
        """The short form a run's reasons are stored and reported in: code, message, fix, and the field and the
        workload when they are set."""
        reason = {"code": self.code, "message": self.message, "fix": self.fix}
        if self.field:
            reason["field"] = self.field
        if self.workload:
            reason["workload"] = self.workload
        return reason


class KvbenchError(Exception):
    """The root of kvbench's errors that a person can act on: it carries the problem, with its fix."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem
