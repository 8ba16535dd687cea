// Type definitions for @procmesh/sdk (hand-written; the implementation is plain JavaScript).
// The shapes mirror the reference engine's Processor interface in camelCase, and the Python
// SDK's JSON shapes (procmesh.convert): see docs/other-languages.md.

import type { ServerCredentials } from '@grpc/grpc-js';

// -- JSON, messages, chunks -----------------------------------------------------------------------

export type JSONValue = null | boolean | number | string | JSONValue[] | { [key: string]: JSONValue };

export interface TextPart {
  type: 'text';
  text: string;
}
export interface ReasoningPart {
  type: 'reasoning';
  text: string;
}
export interface ToolInvocationPart {
  type: 'tool-invocation';
  toolInvocation: {
    state: 'call' | 'result' | 'output-error' | (string & {});
    toolCallId: string;
    toolName: string;
    args: any;
    result?: any;
    errorText?: string;
  };
}
export interface FilePart {
  type: 'file';
  mediaType: string;
  /** A URL (https:, data:) or the inline bytes. */
  data: string | Uint8Array;
  filename?: string;
}
export interface StepStartPart {
  type: 'step-start';
}
export interface DataPart {
  type: `data-${string}`;
  data: any;
}
/**
 * A part of a kind this SDK does not know (a newer orchestrator's): `proto` is its bytes, base64.
 * Returned in a message, it goes back as it came (proto/README.md, forward compatibility).
 */
export interface UnknownPart {
  type: 'procmesh-unknown';
  proto: string;
}
export type MessagePart = TextPart | ReasoningPart | ToolInvocationPart | FilePart | StepStartPart | DataPart | UnknownPart;

/** A MastraDBMessage (format 2). Text lives in `content.parts`. */
export interface MastraDBMessage {
  id: string;
  role: 'user' | 'assistant' | 'system' | 'signal' | 'tool' | (string & {});
  content: { format: 2; parts: MessagePart[]; metadata?: Record<string, any> };
  createdAt?: string;
  threadId?: string;
  resourceId?: string;
  /** For signals: the tag name. */
  type?: string;
}

export interface TextDeltaChunk {
  type: 'text-delta';
  payload: { text: string; id?: string };
}
export interface ToolCallChunk {
  type: 'tool-call';
  payload: { toolCallId: string; toolName: string; args: any };
}
export interface ToolResultChunk {
  type: 'tool-result';
  payload: { toolCallId: string; toolName: string; args: any; result: any; providerExecuted?: boolean };
}
export interface FinishChunk {
  type: 'finish';
  payload: { finishReason: string; usage: Usage; metadata?: Record<string, any> };
}
export interface TripwireChunk {
  type: 'tripwire';
  payload: { processorId: string; reason: string; retry: boolean; metadata: any };
}
export interface DataChunk {
  type: `data-${string}`;
  data: any;
  /** Streamed, never stored. */
  transient?: boolean;
}
export interface OtherChunk {
  type: string;
  payload: Record<string, any>;
}
/** A stream chunk: `{type, payload}`, or `{type: 'data-...', data}`. */
export type ChunkType = TextDeltaChunk | ToolCallChunk | ToolResultChunk | FinishChunk | TripwireChunk | DataChunk | OtherChunk;

export interface Usage {
  inputTokens: number;
  outputTokens: number;
  totalTokens: number;
}
export interface ToolCall {
  toolCallId: string;
  toolName: string;
  args: any;
}
export interface StepResult {
  stepNumber: number;
  text: string;
  toolCalls: ToolCall[];
  toolResults: Array<ToolCall & { result: any }>;
  finishReason: string;
  usage: Usage;
  tripwire: { processorId: string; reason: string; retry: boolean; metadata: any } | null;
}
export interface ToolSpec {
  name: string;
  description?: string;
  /** JSON schema of the arguments. */
  inputSchema?: Record<string, any>;
}
export type ToolChoice = 'auto' | 'none' | 'required' | { type: 'tool'; toolName: string };

/** A provider-shaped prompt message (LanguageModelV2Prompt). */
export type PromptMessage =
  | { role: 'system'; content: string }
  | {
      role: 'user' | 'assistant' | 'tool';
      content: Array<
        | { type: 'text' | 'reasoning'; text: string }
        | { type: 'tool-call'; toolCallId: string; toolName: string; input: any }
        | { type: 'tool-result'; toolCallId: string; toolName: string; output: any }
        | { type: 'file'; mediaType: string; data: string | Uint8Array }
      >;
    };

/** What processAPIError is handed (`statusCode`, `isRetryable`, `responseBody` read the same values). */
export interface APIError {
  status: number;
  message: string;
  body: string;
  retryable: boolean;
  id?: string;
  details: Record<string, any>;
  readonly statusCode: number;
  readonly isRetryable: boolean;
  readonly responseBody: string;
}

// -- what hooks are handed ----------------------------------------------------------------------

export interface AbortOptions {
  /** Replay the step with the reason as feedback (processInputStep / processOutputStep). */
  retry?: boolean;
  /** JSON data attached to the tripwire. */
  metadata?: unknown;
}

export interface Signal {
  type?: 'reactive' | 'user' | 'notification' | 'state' | 'system-reminder' | 'user-message';
  contents: string;
  tagName?: string;
  attributes?: Record<string, JSONValue>;
  transient?: boolean;
  metadata?: Record<string, JSONValue>;
  id?: string;
}

export interface ProcessorWriter {
  /** Emit a custom chunk; the type must start with `data-`. */
  custom(chunk: { type: `data-${string}`; data?: unknown; transient?: boolean }): Promise<void>;
}

export interface ProcessorContext<TOptions = any, TState extends Record<string, any> = Record<string, any>> {
  /** Throws a TripWire: ends the hook. The default reason is `Tripwire triggered by <id>`. */
  abort: (reason?: string, options?: AbortOptions) => never;
  /** This processor's state for this run, shared by all its hooks; mutate it in place (JSON values only). */
  state: TState;
  /** The options from the orchestrator's config (validated against `optionsSchema` when given). */
  options: TOptions;
  retryCount: number;
  stepNumber: number;
  runId: string;
  agentId: string;
  threadId?: string;
  resourceId?: string;
  /** This processor's failure policy as the orchestrator applies it (undefined if it does not say). */
  onFailure?: 'fail-open' | 'fail-closed';
  /**
   * The run's request context (`requestContext.get(key)`): the caller's keys and those earlier
   * hooks set. `requestContext.set(key, value)` sets a value (any JSON) for the rest of the run:
   * later hooks, its tools and a resumed run see it (not in processOutputStream: it throws).
   */
  requestContext: RequestContext;
  sendSignal: (signal: Signal) => Promise<void>;
  writer: ProcessorWriter;
  /** A non-blocking warning; reaches the caller's onViolation. */
  reportViolation: (message: string, detail?: unknown) => void;
  /** Aborted when the call is cancelled or its deadline passes. */
  abortSignal: AbortSignal;
  /** The orchestrator's model `ref` through its model gateway (PROCMESH_MODEL_GATEWAY). */
  model: (ref: string) => GatewayModel;
}

export interface GatewayModelResult {
  text: string;
  /** The parsed answer when a schema was given. */
  object?: unknown;
  usage: { inputTokens: number; outputTokens: number; totalTokens: number };
  finishReason: string;
  model: string;
  attempts: number;
}

export interface GatewayModel {
  /** Ask the model (keys stay in the orchestrator); rejects with an InternalError on a gateway error. */
  generate(
    messages: string | Array<{ role: 'system' | 'user' | 'assistant'; content: string | MastraDBMessage['content'] }>,
    options?: {
      schema?: Record<string, unknown>;
      temperature?: number;
      maxOutputTokens?: number;
      timeoutMs?: number;
      /** A typed verdict the gateway may merge with other guards' about the same content (needs `schema`). */
      section?: { content: string; instructions: string; question: string; phase?: 'input' | 'output' };
    },
  ): Promise<GatewayModelResult>;
  /** Report `count` questions (default 1) settled without asking this model (a cheap pre-check):
   * counted as judge calls saved, `by="precheck"`. Returns at once; never throws. */
  reportSaved(count?: number): void;
}

export interface ProcessInputArgs<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorContext<O, S> {
  /** This request's new input only. */
  messages: MastraDBMessage[];
  /** The whole list; edits through it are sent back. */
  messageList: MessageList;
  systemMessages: MastraDBMessage[];
}
export interface ProcessInputStepArgs<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorContext<O, S> {
  messages: MastraDBMessage[];
  messageList: MessageList;
  systemMessages: MastraDBMessage[];
  model: string;
  tools: ToolSpec[];
  toolChoice?: ToolChoice;
  activeTools: string[];
  providerOptions: Record<string, any>;
  modelSettings: Record<string, any>;
  steps: StepResult[];
}
export interface ProcessLLMRequestArgs<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorContext<O, S> {
  prompt: PromptMessage[];
  model: string;
  steps: StepResult[];
}
export interface ProcessLLMResponseArgs<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorContext<O, S> {
  chunks: ChunkType[];
  model: string;
  steps: StepResult[];
  fromCache: boolean;
}
export interface ProcessOutputStreamArgs<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorContext<O, S> {
  part: ChunkType;
  /** The parts this processor has seen in the current stream, this one included. */
  streamParts: ChunkType[];
  /** Let held parts go now, ahead of the rest of this part's answer (a partial result where the
   * orchestrator takes them, else at the head of what the hook returns); final once released. */
  release(parts: ChunkType | ChunkType[] | null | undefined): void;
}
export interface ProcessOutputStepArgs<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorContext<O, S> {
  messages: MastraDBMessage[];
  messageList: MessageList;
  systemMessages: MastraDBMessage[];
  text: string;
  toolCalls?: ToolCall[];
  finishReason: string;
  usage: Usage;
  steps: StepResult[];
}
export interface ProcessToolResultArgs<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorContext<O, S> {
  messages: MastraDBMessage[];
  toolName: string;
  toolCallId: string;
  args: any;
  result: any;
  providerExecuted: boolean;
  steps: StepResult[];
}
export interface ProcessOutputResultArgs<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorContext<O, S> {
  /** This run's response messages. */
  messages: MastraDBMessage[];
  messageList: MessageList;
  result: { text: string; usage: Usage; finishReason: string; steps: StepResult[] };
}
export interface ExecuteToolArgs<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorContext<O, S> {
  toolName: string;
  toolCallId: string;
  args: unknown;
  messages: MastraDBMessage[];
}

export interface ProcessAPIErrorArgs<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorContext<O, S> {
  error: APIError;
  messages: MastraDBMessage[];
  messageList: MessageList;
  steps: StepResult[];
}

type Maybe<T> = T | void | null | undefined;
type Returns<T> = Maybe<T> | Promise<Maybe<T>>;

export type ProcessInputResult = MastraDBMessage[] | MessageList | { messages?: MastraDBMessage[]; systemMessages?: MastraDBMessage[] };
export interface ProcessInputStepResult {
  messages?: MastraDBMessage[];
  messageList?: MessageList;
  systemMessages?: MastraDBMessage[];
  /** A key of the orchestrator's `models` config, or 'provider/model-id'. */
  model?: string;
  tools?: ToolSpec[] | Record<string, Omit<ToolSpec, 'name'>>;
  toolChoice?: ToolChoice;
  activeTools?: string[];
  providerOptions?: Record<string, any>;
  modelSettings?: Record<string, any>;
}
export interface ProcessLLMRequestResult {
  /** Replaces the prompt for this provider call only. */
  prompt?: PromptMessage[];
  /** Skip the model and replay these chunks. */
  response?: ChunkType[];
}

/** The hooks a processor may implement (any subset). */
export interface ProcessorHooks<O = any, S extends Record<string, any> = Record<string, any>> {
  processInput?(args: ProcessInputArgs<O, S>): Returns<ProcessInputResult>;
  processInputStep?(args: ProcessInputStepArgs<O, S>): Returns<ProcessInputStepResult | MastraDBMessage[] | MessageList>;
  processLLMRequest?(args: ProcessLLMRequestArgs<O, S>): Returns<ProcessLLMRequestResult>;
  processLLMResponse?(args: ProcessLLMResponseArgs<O, S>): Returns<unknown>;
  /** Return the chunk to emit (the same or a new one), several chunks (an array) in its place, or nothing to drop it. */
  processOutputStream?(args: ProcessOutputStreamArgs<O, S>): Returns<ChunkType | ChunkType[]>;
  /** Return the messages that replace the list (`[]`: no change). */
  processOutputStep?(args: ProcessOutputStepArgs<O, S>): Returns<MastraDBMessage[] | MessageList>;
  /** Return the new result, or nothing to keep it. */
  processToolResult?(args: ProcessToolResultArgs<O, S>): Returns<unknown>;
  processOutputResult?(args: ProcessOutputResultArgs<O, S>): Returns<MastraDBMessage[] | MessageList>;
  processAPIError?(args: ProcessAPIErrorArgs<O, S>): Returns<{ retry?: boolean }>;
  /** Run a tool this processor added to a step (processInputStep `tools`); return its result. */
  executeTool?(args: ExecuteToolArgs<O, S>): Returns<unknown>;
}

/** What `serve()` accepts: an object with a string `id` and at least one hook. */
export interface ProcessorLike<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorHooks<O, S> {
  readonly id: string;
  name?: string;
  description?: string;
  /** processOutputStream also receives data-* chunks. */
  processDataParts?: boolean;
  /**
   * Its results depend only on its input, options and state, and a call whose answer is thrown
   * away has no effect outside it: the orchestrator may call it before its input is final.
   */
  speculative?: boolean;
  /** JSON schema of the options: reported by Describe, checked (subset) on every call. */
  optionsSchema?: Record<string, any>;
  /** Turn the raw options into what hooks get; throwing fails the call with INVALID_ARGUMENT. */
  parseOptions?(raw: Record<string, any>): O;
  setup?(): void | Promise<void>;
  teardown?(): void | Promise<void>;
}

/** Optional base class for processors. */
export interface Processor<O = any, S extends Record<string, any> = Record<string, any>> extends ProcessorHooks<O, S> {}
export class Processor<O = any, S extends Record<string, any> = Record<string, any>> {
  id: string;
  name?: string;
  description?: string;
  processDataParts?: boolean;
  speculative?: boolean;
  optionsSchema?: Record<string, any>;
  parseOptions?(raw: Record<string, any>): O;
  setup(): Promise<void>;
  teardown(): Promise<void>;
}

/** Thrown by `abort()`; a hook may also throw one itself. */
export class TripWire extends Error {
  constructor(reason?: string, options?: AbortOptions, processorId?: string);
  readonly reason: string;
  readonly options: { retry: boolean; metadata?: unknown };
  readonly retry: boolean;
  readonly metadata: unknown;
  readonly processorId?: string;
}

/** The live message list; edits are sent back to the orchestrator. */
export class MessageList {
  /** `sources`: each message's source by id (RunContext.message_sources; unnamed: `input`). */
  constructor(messages: MastraDBMessage[], sources?: Record<string, string>);
  readonly modified: boolean;
  getAll(): MastraDBMessage[];
  /** The reference engine's read views: `get.all.db()`, and by source `get.input.db()` (this
   * call's input), `get.response.db()` (what this run added), `get.remembered.db()` (memory). */
  readonly get: {
    all: { db(): MastraDBMessage[] };
    input: { db(): MastraDBMessage[] };
    response: { db(): MastraDBMessage[] };
    remembered: { db(): MastraDBMessage[] };
  };
  add(message: MastraDBMessage | MastraDBMessage[]): this;
  removeByIds(ids: Iterable<string>): this;
  replace(message: MastraDBMessage): this;
}

export class RequestContext extends Map<string, any> {
  /** `updates`: where set() records a hook's values (null: set() throws; absent: a plain Map). */
  constructor(entries?: Record<string, any> | Map<string, any>, updates?: Map<string, any> | null);
  toJSON(): Record<string, any>;
}

export class Writer implements ProcessorWriter {
  custom(chunk: { type: `data-${string}`; data?: unknown; transient?: boolean }): Promise<void>;
}

export const HOOK_NAMES: readonly [
  'processInput',
  'processInputStep',
  'processLLMRequest',
  'processLLMResponse',
  'processOutputStream',
  'processOutputStep',
  'processToolResult',
  'processOutputResult',
  'processAPIError',
  'executeTool',
];

export type HookName = (typeof HOOK_NAMES)[number];

/** One row of the hook table (the twin of the Python SDK's procmesh.hooks.Hook). */
export interface Hook {
  /** The method name, e.g. `processInput`. */
  readonly name: HookName;
  /** The ProcessorService method, e.g. `ProcessInput`. */
  readonly rpc: string;
  /** The procmesh.v1.Hook number. */
  readonly enum: number;
  /** The procmesh.v1.Hook name, as Describe lists it, e.g. `HOOK_PROCESS_INPUT`. */
  readonly enumName: string;
  /** The arguments the hook receives. */
  readonly arguments: readonly string[];
  /** The request and response message names. */
  readonly request: string;
  readonly response: string;
  /** True for the bidirectional output stream. */
  readonly streaming: boolean;
}

/** The hook table: every hook in the proto enum's order, and indexes of it. */
export namespace hooks {
  const HOOKS: readonly Hook[];
  const HOOK_NAMES: readonly HookName[];
  const BASE_ARGUMENTS: readonly string[];
  const BY_NAME: Readonly<Record<HookName, Hook>>;
  const BY_RPC: Readonly<Record<string, Hook>>;
  const BY_ENUM: Readonly<Record<number, Hook>>;
}

// -- hosted tools ------------------------------------------------------------------------------------

/** What a hosted tool's execute() is handed besides its arguments. */
export interface ToolContext {
  runId: string;
  agentId: string;
  /** The model's id for this call. */
  toolCallId: string;
  /** The run's memory thread (undefined without memory). */
  threadId?: string;
  resourceId?: string;
  requestContext: RequestContext;
  /** The conversation so far. */
  messages: MastraDBMessage[];
  /** Fires when the call is cancelled or its deadline passes. */
  abortSignal: AbortSignal;
  /** Emits data-* chunks to the caller's stream, at the call's turn, before its tool-result. */
  writer: ToolWriter;
  /** Suspend the call (the reference's suspend(payload)): once execute() returns, what it returned
   * is dropped, the run stops at this call (kept in the orchestrator's store) and streams
   * `tool-call-suspended`; resumed with data, execute() runs again with `resumeData` set. */
  suspend(payload: unknown): Promise<void>;
  /** True when the call suspended before and the caller resumed it with data. */
  resumed: boolean;
  /** What the caller resumed the call with (the reference's resumeData); set only when resumed. */
  resumeData?: unknown;
  /** What the call suspended with last time; set only when resumed. */
  suspendPayload?: unknown;
  /** The same as the reference's tools read them: `ctx.agent.suspend`, `ctx.agent.resumeData`. */
  agent: { toolCallId: string; suspend(payload: unknown): Promise<void>; resumeData?: unknown; suspendPayload?: unknown };
}

/** What a tool's lifecycle hooks get (the reference's ToolCallOptions). */
export interface ToolCallOptions {
  toolCallId: string;
  messages: MastraDBMessage[];
  abortSignal: AbortSignal;
}

export class ToolWriter {
  custom(chunk: { type: `data-${string}`; data?: unknown; transient?: boolean }): Promise<void>;
}

/**
 * A standalone tool the sidecar hosts, which agent configs name: `serve(processors, {tools: [...]})`.
 * What execute() returns (JSON) is the result; what it throws is the tool's error, shown to the
 * model (a ProcmeshError fails the call with its status instead). The SDK does not validate
 * `args` against `inputSchema`; the orchestrator does.
 */
export interface Tool<A = any> {
  /** Unique in the sidecar: 1-64 letters, digits, `_` or `-`. */
  name: string;
  description?: string;
  /** JSON schema of the arguments, an object schema (default `{type: 'object'}`). */
  inputSchema?: Record<string, any>;
  execute(args: A, ctx: ToolContext): unknown | Promise<unknown>;
  /** What the model sees of the result (the seeds' toModelOutput); the caller keeps the result. */
  toModelOutput?(result: any): unknown | Promise<unknown>;
  /** JSON schema of the data a suspended call expects (the chunk's `resumeSchema`). */
  resumeSchema?: Record<string, any>;
  /** Lifecycle hooks (the reference's): a call begins; its arguments are whole (before execute);
   * execute returned (not after a throw or a suspension). The sidecar gets the arguments whole,
   * so onInputStart comes right before onInputAvailable and no onInputDelta comes. What one throws
   * is logged, never the call's failure. */
  onInputStart?(options: ToolCallOptions): void | Promise<void>;
  onInputAvailable?(options: ToolCallOptions & { input: A }): void | Promise<void>;
  onOutput?(options: { toolCallId: string; toolName: string; output: unknown; abortSignal: AbortSignal }): void | Promise<void>;
  setup?(): void | Promise<void>;
  teardown?(): void | Promise<void>;
}

// -- serving ---------------------------------------------------------------------------------------

export const SERVICE_NAME: 'procmesh.v1.ProcessorService';
export const version: string;

export interface ServeOptions {
  /** `host:port` or `unix:///path.sock`. */
  address?: string;
  addresses?: string[];
  /** Drain time after SIGTERM/SIGINT (default 10). */
  graceSeconds?: number;
  logLevel?: 'DEBUG' | 'INFO' | 'WARNING' | 'ERROR' | (string & {});
  /** `text` (default) or `json`: one JSON object per line (time, level, logger, message, run_id). */
  logFormat?: 'text' | 'json';
  /** Serve Prometheus metrics (the Python SDK's names) on this port. */
  metricsPort?: number;
  /** Interface of the metrics port (default: where gRPC binds). */
  metricsHost?: string;
  /** The program's own flags (each takes a value): accepted on the command line, not an error. */
  extraFlags?: string[];
  /** Stop when this process is no longer the parent. */
  parentPid?: number;
  credentials?: ServerCredentials;
  tlsCert?: string;
  tlsKey?: string;
  tlsClientCa?: string;
  /** Largest request or response (default 16 MiB). */
  maxMessageBytes?: number;
  /** SIGTERM/SIGINT stop the server within the grace period, then exit (default true). */
  handleSignals?: boolean;
  /** Standalone tools to host beside the processors (names unique). */
  tools?: Tool[];
}

export class ProcessorServer {
  constructor(processors: ProcessorLike[], options?: { address?: string; addresses?: string[]; credentials?: ServerCredentials; maxMessageBytes?: number; logLevel?: string; logFormat?: 'text' | 'json'; metricsPort?: number; metricsHost?: string; tools?: Tool[] });
  /** The bound addresses (ports resolved) once started. */
  readonly addresses: string[];
  readonly processorIds: string[];
  readonly toolNames: string[];
  start(): Promise<this>;
  stop(graceSeconds?: number): Promise<void>;
}

/** Serve `processors` (with grpc.health.v1); resolves once SERVING. */
export function serve(processors: ProcessorLike[], options?: ServeOptions): Promise<ProcessorServer>;
/** `serve()` with every setting from the command line and environment; a bad setting exits 2, another failure 1. */
export function run(processors: ProcessorLike[], overrides?: ServeOptions): Promise<ProcessorServer>;
/** Strict: an unknown flag or a value that does not parse throws (`run()` prints it and exits 2). */
export function settingsFromArgs(
  argv?: string[],
  env?: Record<string, string | undefined>,
  options?: { extraFlags?: string[] },
): ServeOptions & { addresses: string[]; extra: Record<string, string>; action?: 'help' | 'version' };
/** The directory procmesh/v1/*.proto is loaded from. */
export function protoDir(): string;
/** The loaded procmesh.v1 package for @grpc/grpc-js (`.ProcessorService.service`, clients). */
export function loadContract(): any;

export namespace errors {
  class ProcmeshError extends Error {
    readonly code: number;
  }
  class InvalidInputError extends ProcmeshError {}
  class NotFoundError extends ProcmeshError {}
  class UnimplementedError extends ProcmeshError {}
  class NotReadyError extends ProcmeshError {}
  /** A rewind (or commit) of a stream whose processor is not speculative. */
  class FailedPreconditionError extends ProcmeshError {}
  class InternalError extends ProcmeshError {}
  /** The model gateway refused or failed a call (`model(...)`); `status` is its gRPC status code. */
  class ModelError extends InternalError {
    readonly status: number;
  }
}

/** Wire <-> JSON conversion (the twin of the Python SDK's procmesh.convert). */
export namespace convert {
  function toValue(value: unknown): any;
  function fromValue(value: any): any;
  function toStruct(obj: Record<string, any> | null | undefined): any;
  function fromStruct(struct: any): Record<string, any>;
  function messageToProto(msg: MastraDBMessage): any;
  function messageFromProto(msg: any): MastraDBMessage;
  function chunkToProto(chunk: ChunkType): any;
  function chunkFromProto(chunk: any): ChunkType;
  function promptToProto(prompt: PromptMessage[]): any[];
  function promptFromProto(prompt: any[]): PromptMessage[];
  function stepFromProto(step: any): StepResult;
  function stepToProto(step: StepResult): any;
}
