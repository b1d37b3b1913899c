/**
 * execgate's TypeScript client: send an agent's tool calls to the daemon, get typed
 * outcomes; run a model loop whose every transition the daemon records.
 *
 *     import { Client } from "@execgate/client";
 *     const eg = new Client({ address: "unix:/path/execgate.sock" });
 *     const outcome = await eg.executeOne("read_file", { path: "README.md" });
 *     console.log(outcome.status, outcome.text);
 *
 * Layout (one step of the data flow per module):
 *
 *     transport   address, token, channel credentials (EXECGATE_ADDR / EXECGATE_TOKEN)
 *     rpc         unary calls as promises, streams as async iterators, errors translated
 *     wire        generated protobuf messages (src/gen, built from proto/) <-> types
 *     types       Outcome, Call, Event, CallRecord, Approval, ... (no protobuf)
 *     errors      the exception tree
 *     client      Executor; approvals (Approvals service); runs (Runs service)
 *     loop/       states, tally, stops, observe, record, gate, batch, driver (Loop)
 *     models/     the Model interface and ScriptedModel
 */

export { Approvals } from "./approvals.js";
export {
  type CancelOptions,
  Client,
  type ClientOptions,
  type ExecuteOptions,
  type ListCallsOptions,
  type OneCallOptions,
  type StreamOptions,
} from "./client.js";
export {
  ApprovalNotPending,
  CallNotFound,
  DaemonUnavailable,
  ExecgateClientError,
  PermissionDenied,
  RequestError,
  RunNotFound,
  RunRefused,
  Unauthenticated,
} from "./errors.js";
export { Loop, type LoopOptions } from "./loop/driver.js";
export { IllegalTransition, LoopError } from "./loop/errors.js";
export {
  bound,
  DAEMON_HINTS,
  hintFor,
  type Observation,
  observe,
  type Refusal,
  REFUSAL_HINTS,
  render,
} from "./loop/observe.js";
export {
  DEFAULT_LIMITS,
  type LoopResult,
  type SoFar,
  type Verdict,
  type Verifier,
} from "./loop/results.js";
export {
  checkTransition,
  Machine,
  RESUME_INTO,
  type State,
  STATES,
  STOPS,
  type StopState,
  TERMINAL,
  type Transition,
  TRANSITIONS,
} from "./loop/states.js";
export {
  Cancelled,
  Deadline,
  MaxConsecutiveErrors,
  MaxCost,
  MaxSteps,
  MaxTokens,
  NoProgress,
  PRIORITY,
  type Stop,
  type StopBounds,
  type StopRule,
  StopRules,
} from "./loop/stops.js";
export {
  type CancelRequest,
  canonicalArguments,
  type Figures,
  fingerprint,
  Tally,
} from "./loop/tally.js";
export { type Path, pathOf, UNVERIFIED, type Verification } from "./loop/backing.js";
export { type Attempt, type RetryOptions, retryable } from "./loop/retry.js";
export { type AnthropicOptions, AnthropicMessagesModel } from "./models/anthropic.js";
export { type Pricing } from "./models/http.js";
export { type OpenAIOptions, OpenAIChatModel } from "./models/openai.js";
export {
  type Ending,
  ENDINGS,
  endingOf,
  isFinal,
  type Message,
  type Model,
  ModelBadResponse,
  ModelError,
  ModelRateLimited,
  ModelRequestRejected,
  type ModelTool,
  ModelUnavailable,
  ScriptExhausted,
  type ToolCall,
  type ToolResult,
  type Turn,
  type Usage,
} from "./models/base.js";
export { type CallSpec, ScriptedModel, type Step } from "./models/scripted.js";
export {
  type CancelNotice,
  type FindOptions,
  isCancelNotice,
  type RunDetail,
  type RunInfo,
  type RunLimits,
  Runs,
  type StartOptions,
  type StepOptions,
  type StepResult,
} from "./runs.js";
export { DEFAULT_ADDRESS, resolveAddress, resolveToken, type TlsConfig } from "./transport.js";
export {
  type AccessMode,
  type Approval,
  type ApprovalState,
  type Call,
  type CallPlan,
  type CallRecord,
  type ErrorClass,
  type Event,
  type EventKind,
  type Evidence,
  type Mark,
  Outcome,
  type OutcomeFields,
  type Phase,
  type PolicyDecision,
  type ProviderStatus,
  type Status,
  STATUSES,
  type StopMode,
  type ToolSpec,
} from "./types.js";
