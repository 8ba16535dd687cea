"""Resuming a suspended run: the approve / decline bodies and resume-stream's, validated into a
`ResumeRequest` (the HTTP routes parse them here; the gRPC API builds the same request)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from procmesh_orchestrator.run.hooks import Resumed
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service._limits import InputLimits, check_input
from procmesh_orchestrator.service._trust import ContextTrust
from procmesh_orchestrator.service.api.call_options import check_stream_format, validated
from procmesh_orchestrator.store import MAX_ID_CHARS


@dataclass
class ResumeRequest:
    """A validated approve / decline request: which run, which call, and why (a decline); or a
    resume-stream request, with the data a suspended tool asked for (`data`)."""

    run_id: str
    tool_call_id: str | None
    """None (resume-stream only): the run's only awaited call."""
    reason: str | None
    request_context: dict[str, Any]
    data: Resumed | None = None
    """resume-stream's ``resumeData`` (the tool sees it); None for approve / decline."""


class _ApproveBody(BaseModel):
    """approve-tool-call's body (and -generate's): the keys the reference's route takes, each
    honoured or refused; any other key is refused by name (@mastra/client-js sends what its caller
    gives, but strips ``abortSignal``)."""

    model_config = ConfigDict(extra="forbid")

    run_id: str = Field(alias="runId", min_length=1, max_length=MAX_ID_CHARS)
    tool_call_id: str = Field(alias="toolCallId", min_length=1, max_length=MAX_ID_CHARS)
    request_context: dict[str, Any] | None = Field(default=None, alias="requestContext")
    model: Any = None
    """The reference's model for the resumed run: refused (`_refuse_unhonoured`)."""
    format: Any = None
    """The reference's stream format: ``"mastra"`` (what procmesh streams) or refused."""


class _DeclineBody(_ApproveBody):
    """decline-tool-call's body: approve's and the ``reason`` the model is told."""

    reason: str | None = Field(default=None, max_length=4096)


def _refuse_unhonoured(body: _ApproveBody) -> None:
    """A 400 for the reference's keys procmesh cannot honour on a resume: running the resumed
    run on another model than asked, or in another stream format, would be a silent change."""
    if body.model is not None:
        raise BadRequestError(
            "model: procmesh resumes a run with the model it ran with (its call's model and "
            "prepareSteps); leave model out"
        )
    check_stream_format(body.format)


class _ResumeDataBody(BaseModel):
    model_config = ConfigDict(extra="forbid")  # the snapshot decides the rest: an option is an error

    run_id: str = Field(alias="runId", min_length=1, max_length=MAX_ID_CHARS)
    tool_call_id: str | None = Field(default=None, alias="toolCallId", min_length=1, max_length=MAX_ID_CHARS)
    resume_data: Any = Field(alias="resumeData")
    request_context: dict[str, Any] | None = Field(default=None, alias="requestContext")


def parse_resume_data(
    data: Any, *, caller: Caller, trust: ContextTrust, limits: InputLimits
) -> ResumeRequest:
    """The body of resume-stream (`@mastra/client-js` ``resumeStream(resumeData, {runId,
    toolCallId?})``: without ``toolCallId``, the run's only awaited call); its request context as
    `trust` allows `caller`. ``resumeData`` is required (null included); any other key is refused
    by name."""
    if not isinstance(data, dict):
        raise BadRequestError("the body must be a JSON object with 'runId', 'resumeData' and 'toolCallId'?")
    check_input(data, limits)
    body = validated(_ResumeDataBody, data)
    context = trust.check(caller, body.request_context or {})
    return ResumeRequest(body.run_id, body.tool_call_id, None, context, Resumed(body.resume_data, None))


def parse_approval(approved: bool) -> ResumeParser:
    """The parser of approve-tool-call's body (`approved`) or decline-tool-call's (and of the
    -generate routes'); its request context as `trust` allows `caller`. A key the route does not
    take (``reason`` on an approval included) or cannot honour (``model``, a ``format`` other than
    ``"mastra"``) is a 400 naming it: the decision is not taken, the run stays suspended."""
    model = _ApproveBody if approved else _DeclineBody

    def parse(data: Any, *, caller: Caller, trust: ContextTrust, limits: InputLimits) -> ResumeRequest:
        if not isinstance(data, dict):
            raise BadRequestError("the body must be a JSON object with 'runId' and 'toolCallId'")
        check_input(data, limits)
        body = validated(model, data)
        _refuse_unhonoured(body)
        context = trust.check(caller, body.request_context or {})
        reason = body.reason if isinstance(body, _DeclineBody) else None
        return ResumeRequest(body.run_id, body.tool_call_id, reason, context)

    return parse


class ResumeParser(Protocol):
    """`parse_approval`'s parsers or `parse_resume_data`: a resume route's body as a `ResumeRequest`."""

    def __call__(
        self, data: Any, *, caller: Caller, trust: ContextTrust, limits: InputLimits
    ) -> ResumeRequest: ...
