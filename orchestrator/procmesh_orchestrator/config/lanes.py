"""Lanes as the configuration states them: processor references, workflows (parallel and
conditional steps), and lanes chosen from the request context.

Agents name them (agents.py); `schema.py`'s `Config` checks what they refer to.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.config.conditions import check_when
from procmesh_orchestrator.config.cost import PROCESSOR_NAMES as COST_NAMES
from procmesh_orchestrator.config.tools import FailurePolicy


class _Model(BaseModel):
    # each config module states its base itself, so linters see pydantic models (tools.py, schema.py)
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class WebhookRoute(_Model):
    """``onViolation: {webhook: URL}``: each violation of the entry is POSTed there as JSON."""

    webhook: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = {}
    timeout: float = Field(default=5.0, gt=0)


ViolationRoute = Literal["log"] | WebhookRoute
"""Where a lane entry's violations go besides the run's result (`run.violation_routes`)."""


class ProcessorRef(_Model):
    """A lane entry: ``sidecar/processor-id`` plus per-agent options and policy; or
    ``token-cost-control`` (alias ``cost-guard``), which the orchestrator runs itself."""

    processor: str
    options: dict[str, Any] = {}
    timeout: float | None = Field(default=None, gt=0)
    stream_timeout: float | None = Field(default=None, gt=0)
    """The sidecar's ``streamTimeout`` for this entry (seconds an output-stream session may stay open)."""
    on_failure: FailurePolicy | None = None
    name: str | None = None
    """This instance's name (default: the processor id): several instances of one processor, each
    with its own options, state and tripwire id, and the key a workflow's ``map`` picks."""
    mode: Literal["enforce", "monitor"] = "enforce"
    """``monitor`` runs the processor and records what it would have done (block, rewrite, drop,
    retry: procmesh_monitor_decisions_total, a log line, its span) without applying any of it;
    ``shadow``, its former name, is read as ``monitor``."""
    speculative: bool | None = None
    """``false`` turns speculation off for this entry (the default follows the processor's
    Describe); ``true`` for a processor that does not declare it is a start-up error."""
    when: Any = None
    """Run this entry only when the condition holds for the run's request context (`check_when`;
    on an input or output lane's entry and a workflow's plain step)."""
    on_violation: ViolationRoute | None = None
    """The seeds' per-processor ``onViolation``: ``log`` (a WARNING line) or ``{webhook: URL}``,
    for each abort and warning of this entry, in every run."""

    @model_validator(mode="before")
    @classmethod
    def _error_strategy(cls, value: Any) -> Any:
        # the reference's guard option, kept as procmesh's onFailure (docs/builtins.md, SEED-GAPS M9)
        if isinstance(value, dict) and {"errorStrategy", "error_strategy"} & set(value):
            raise ValueError(
                "errorStrategy is onFailure here: onFailure: fail-open for the reference's 'warn', "
                "fail-closed (the default) for 'strict'"
            )
        return value

    @field_validator("when")
    @classmethod
    def _when(cls, value: Any) -> Any:
        return None if value is None else check_when(value)

    @field_validator("mode", mode="before")
    @classmethod
    def _former_mode(cls, value: Any) -> Any:
        return "monitor" if value == "shadow" else value

    @field_validator("processor")
    @classmethod
    def _shape(cls, value: str) -> str:
        sidecar, _, pid = value.partition("/")
        if (not sidecar or not pid) and value not in COST_NAMES:
            raise ValueError(f"expected 'sidecar/processor-id' or token-cost-control, got {value!r}")
        return value

    @property
    def sidecar(self) -> str:
        """The sidecar's name."""
        return self.processor.partition("/")[0]

    @property
    def instance(self) -> str:
        """The name the run knows this entry by."""
        return self.name or self.processor_id

    @property
    def processor_id(self) -> str:
        """The processor's id on that sidecar (the orchestrator's cost control: its id)."""
        return COST_NAMES[0] if self.processor in COST_NAMES else self.processor.partition("/")[2]


class WorkflowRef(_Model):
    """A lane entry that runs a workflow declared under ``workflows`` (``workflow:NAME`` as a string)."""

    workflow: str


def _entry_kind(value: Any) -> str:
    if isinstance(value, dict):
        if "processor" in value:
            return "<processor>"
        for key in ("workflow", "parallel", "when", "try"):
            if key in value:
                return f"<{key}>"
        return "<processor>"
    if isinstance(value, WorkflowRef):
        return "<workflow>"
    if isinstance(value, ParallelStep):
        return "<parallel>"
    if isinstance(value, ConditionalStep):
        return "<when>"
    if isinstance(value, TryStep):
        return "<try>"
    return "<processor>"


_UNION_TAGS = {"<workflow>", "<parallel>", "<when>", "<try>", "<processor>"}
"""Discriminator tags pydantic puts in error locations; error messages leave them out."""

LaneEntry = Annotated[
    Annotated[ProcessorRef, Tag("<processor>")] | Annotated[WorkflowRef, Tag("<workflow>")],
    Discriminator(_entry_kind),
]


def _ref(value: Any) -> Any:
    if isinstance(value, str):
        if value.startswith("workflow:"):
            return {"workflow": value.removeprefix("workflow:")}
        return {"processor": value}
    return value


def _lane(value: Any) -> Any:
    return [_ref(v) for v in value] if isinstance(value, list) else value


class BranchMerge(_Model):
    """A parallel step's ``map: {merge: first|last}``: its result field by field, each from the
    first (or last) branch, in listed order, whose answer set that field."""

    merge: Literal["first", "last"]


class ParallelStep(_Model):
    """Branches that run concurrently on the same input; `map` says whose result goes on."""

    parallel: list[ProcessorRef]
    map: str | BranchMerge | None = None
    """``processor:<id>`` of the branch whose result goes on (default: the first branch), or
    ``{merge: first|last}`` (`BranchMerge`)."""

    @field_validator("parallel", mode="before")
    @classmethod
    def _branches(cls, value: Any) -> Any:
        return _lane(value)

    @model_validator(mode="after")
    def _picked(self) -> ParallelStep:
        if not self.parallel:
            raise ValueError("parallel needs at least one branch")
        if isinstance(self.map, str):
            ids = [f"processor:{r.instance}" for r in self.parallel]
            if self.map not in ids:
                raise ValueError(f"map {self.map!r} names no branch (branches: {ids})")
        return self


class ConditionalStep(_Model):
    """Runs `then` when `when` holds for the request context (`check_when`), else `otherwise`."""

    when: dict[str, Any] | list[dict[str, Any]]
    then: list[ProcessorRef]
    otherwise: list[ProcessorRef] = []

    @field_validator("when", mode="before")
    @classmethod
    def _when(cls, value: Any) -> Any:
        return check_when(value)

    @field_validator("then", "otherwise", mode="before")
    @classmethod
    def _branches(cls, value: Any) -> Any:
        return _lane(value)


CaughtStep = Annotated[
    Annotated[ParallelStep, Tag("<parallel>")] | Annotated[ProcessorRef, Tag("<processor>")],
    Discriminator(_entry_kind),
]
"""What an error step's `try` and `catch` hold: one processor or one parallel step."""


class TryStep(_Model):
    """A workflow's error step (the reference's fallback branch on a failed step): `try` runs;
    when it fails as the run would fail for it (a fail-closed processor's error, timeout or
    malformed answer, an input it refused), `catch` runs in its place on the same input. A
    tripwire is a verdict, not a failure: it is never caught."""

    try_: CaughtStep = Field(alias="try")
    catch: CaughtStep

    @field_validator("try_", "catch", mode="before")
    @classmethod
    def _one_step(cls, value: Any) -> Any:
        if isinstance(value, list):
            raise ValueError("one processor or one parallel step (not a list)")
        nested = value.startswith("workflow:") if isinstance(value, str) else None
        if nested or (isinstance(value, dict) and {"workflow", "when", "try"} & set(value)):
            raise ValueError("one processor or one parallel step (a workflow or condition is not caught)")
        return _ref(value)


WorkflowStep = Annotated[
    Annotated[ParallelStep, Tag("<parallel>")]
    | Annotated[ConditionalStep, Tag("<when>")]
    | Annotated[TryStep, Tag("<try>")]
    | Annotated[WorkflowRef, Tag("<workflow>")]
    | Annotated[ProcessorRef, Tag("<processor>")],
    Discriminator(_entry_kind),
]


class WorkflowConfig(_Model):
    """Processors composed into one lane entry: sequential steps, parallel branches, conditions,
    and other workflows (``workflow:NAME`` as a step runs that workflow's steps in its place)."""

    steps: list[WorkflowStep]

    @field_validator("steps", mode="before")
    @classmethod
    def _steps(cls, value: Any) -> Any:
        return _lane(value)


class LaneByContext(_Model):
    """A lane chosen per call from the request context (the seeds' ``inputProcessors:
    ({ requestContext }) => [...]``): ``cases[V]`` for ``requestContext[key] == V``, else `default`."""

    key: str = Field(min_length=1)
    """The request-context key whose value picks the case."""
    cases: dict[str, list[LaneEntry]]
    default: list[LaneEntry] = []
    """The lane when the key is missing, not a string, or names no case."""

    @field_validator("cases", mode="before")
    @classmethod
    def _case_refs(cls, value: Any) -> Any:
        return {k: _lane(v) for k, v in value.items()} if isinstance(value, dict) else value

    @field_validator("default", mode="before")
    @classmethod
    def _default_refs(cls, value: Any) -> Any:
        return _lane(value)

    def lanes(self) -> list[tuple[str, list[LaneEntry]]]:
        """Every list it may choose, with its place in the config (``cases.acme``, ``default``)."""
        return [*((f"cases.{name}", lane) for name, lane in self.cases.items()), ("default", self.default)]


def option_models(options: Any, key: str = "") -> Iterator[str]:
    """Model references in a processor's options: string values of keys naming a model (``model``,
    or a key ending in ``_model`` or ``Model``, at any depth); an option a run takes from its request
    context (``{fromContext, default, cases}``) names its default and its cases' values (the
    config's, never the caller's)."""
    if isinstance(options, Mapping) and key and "fromContext" in options:
        for value in [options.get("default"), *dict(options.get("cases") or {}).values()]:
            yield from option_models(value, key)
    elif isinstance(options, Mapping):
        for name, value in options.items():
            yield from option_models(value, str(name))
    elif isinstance(options, list):
        for item in options:
            yield from option_models(item, key)
    elif isinstance(options, str) and (key == "model" or key.endswith(("_model", "Model"))):
        yield options


def workflow_refs(step: WorkflowStep) -> list[ProcessorRef]:
    """The processors a workflow step names itself (a nested workflow's are in its own steps)."""
    if isinstance(step, ParallelStep):
        return list(step.parallel)
    if isinstance(step, ConditionalStep):
        return [*step.then, *step.otherwise]
    if isinstance(step, TryStep):
        return [*workflow_refs(step.try_), *workflow_refs(step.catch)]
    if isinstance(step, WorkflowRef):
        return []
    return [step]


def check_workflows(workflows: Mapping[str, WorkflowConfig]) -> None:
    """Refuse a step naming an unknown workflow, and workflows that nest in a cycle (it would never
    end): ValueError naming the step, or the cycle's path (``a -> b -> a``)."""
    for name, workflow in workflows.items():
        for i, step in enumerate(workflow.steps):
            if isinstance(step, WorkflowRef) and step.workflow not in workflows:
                raise ValueError(
                    f"workflows.{name}.steps.{i}: unknown workflow {step.workflow!r} "
                    f"(declared: {sorted(workflows)})"
                )
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = [*path[path.index(name) :], name]
            raise ValueError(
                f"workflows: {' -> '.join(cycle)} nest in a cycle (a workflow cannot contain itself)"
            )
        if name in done:
            return
        for step in workflows[name].steps:
            if isinstance(step, WorkflowRef):
                visit(step.workflow, [*path, name])
        done.add(name)

    for name in workflows:
        visit(name, [])


def workflow_processors(
    name: str, workflows: Mapping[str, WorkflowConfig], where: str
) -> list[tuple[str, ProcessorRef]]:
    """Every processor workflow `name` runs, nested workflows' included, each with its place
    (`check_workflows` passed: no cycle)."""
    workflow = workflows.get(name)
    out: list[tuple[str, ProcessorRef]] = []
    for j, step in enumerate(workflow.steps if workflow is not None else ()):
        if isinstance(step, WorkflowRef):
            out += workflow_processors(step.workflow, workflows, f"{where} (workflow {name}, step {j})")
            continue
        out += [(f"{where} (workflow {name}, step {j})", ref) for ref in workflow_refs(step)]
    return out


def _lane_refs(
    where: str, entries: Sequence[LaneEntry], workflows: Mapping[str, WorkflowConfig]
) -> list[tuple[str, ProcessorRef]]:
    """A lane's processor references with their places, a workflow's steps in its place."""
    out: list[tuple[str, ProcessorRef]] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, ProcessorRef):
            out.append((f"{where}.{i}", entry))
            continue
        out += workflow_processors(entry.workflow, workflows, f"{where}.{i}")
    return out


def lane_instances(
    candidates: Mapping[str, Sequence[tuple[str, Sequence[LaneEntry]]]],
    workflows: Mapping[str, WorkflowConfig],
) -> None:
    """Refuse two entries of one agent that a run would know by one instance id (a processor's
    `name`, else its id) yet are not the same entry: they would share one state and one tripwire
    id without a word. `candidates` holds, per lane kind, every list a call of that kind may get
    (a static lane, or each case and the default of one chosen by context); lists of one kind never
    meet in a call, so each case may give a processor its own options.

    One entry listed in several lanes (a processor with input and output hooks) is one instance,
    as in the seeds; listed twice in one lane it is refused, since it runs once."""
    per_list = {
        where: _lane_refs(where, entries, workflows)
        for lists in candidates.values()
        for where, entries in lists
    }
    for refs in per_list.values():
        seen: dict[str, str] = {}
        for place, ref in refs:
            if ref.instance in seen:
                raise ValueError(
                    f"{place}: processor instance {ref.instance!r} is already at {seen[ref.instance]} in "
                    "this lane (it runs once per lane); give each entry its own `name` (each then has its "
                    "own state and tripwire id), or list it once"
                )
            seen[ref.instance] = place
    kinds = list(candidates)
    for a, kind in enumerate(kinds):
        for other in kinds[a + 1 :]:
            for where, _ in candidates[kind]:
                for there, _ in candidates[other]:
                    _same_instances(per_list[where], per_list[there])


def _same_instances(left: list[tuple[str, ProcessorRef]], right: list[tuple[str, ProcessorRef]]) -> None:
    first = {ref.instance: (place, ref) for place, ref in left}
    for place, ref in right:
        found = first.get(ref.instance)
        if found is not None and found[1] != ref:
            raise ValueError(
                f"{place}: processor instance {ref.instance!r} is also at {found[0]} with other settings; "
                "one run would give both one state and one tripwire id: give each entry its own `name`, "
                "or the same settings"
            )


def violation_routes(
    candidates: Mapping[str, Sequence[tuple[str, Sequence[LaneEntry]]]],
    workflows: Mapping[str, WorkflowConfig],
) -> dict[str, ViolationRoute]:
    """The ``onViolation`` route of each processor instance of one agent (`lane_instances`'s
    `candidates`): a run finds a violation's route by the id it carries. Two entries of one
    instance id (in two cases of a lane chosen by context) that route differently are refused."""
    routes: dict[str, tuple[str, ViolationRoute]] = {}
    for lists in candidates.values():
        for where, entries in lists:
            for place, ref in _lane_refs(where, entries, workflows):
                if ref.on_violation is None:
                    continue
                seen = routes.setdefault(ref.instance, (place, ref.on_violation))
                if seen[1] != ref.on_violation:
                    raise ValueError(
                        f"{place}.onViolation: processor instance {ref.instance!r} routes its "
                        f"violations otherwise at {seen[0]}; give the entries their own `name`"
                    )
    return {instance: route for instance, (_, route) in routes.items()}
