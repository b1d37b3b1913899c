"""The blocking client."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any

import grpc

from execgate.v1 import executor_pb2 as pb
from execgate.v1 import executor_pb2_grpc as pb_grpc

from . import _transport, wire
from ._transport import TlsConfig
from .runs import Runs
from .types import (
    Approval,
    Call,
    CallPlan,
    CallRecord,
    Event,
    Outcome,
    PolicyExplanation,
    ProviderStatus,
    Status,
    ToolSpec,
)


class Client:
    """A connection to an execgate daemon.

    Args:
        address: `unix:PATH` or `HOST:PORT`; default $EXECGATE_ADDR, then
            `unix:var/execgate.sock` (what `make run` listens on).
        run_id: the run calls belong to unless a call says otherwise ("" = the
            daemon's implicit run "default").
        token: the bearer token of this client's identity; default $EXECGATE_TOKEN,
            else, on a Unix socket, the `tokens/agent.token` beside it (what `make
            run` makes). A daemon without an identities file needs none.
        tls: certificates for a daemon's mTLS TCP listener; None: plaintext (the
            Unix socket, or a TCP listener without TLS).
        workspace: the workspace calls work in unless a call says otherwise: one the
            daemon's policy gives this identity ("" = its run's, else its first).
            Another is REJECTED permission_denied, field "workspace".
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        run_id: str = "",
        token: str | None = None,
        tls: TlsConfig | None = None,
        workspace: str = "",
    ) -> None:
        self.address = wire.resolve_address(address)
        self.run_id = run_id
        self.workspace = workspace
        self._metadata = _transport.call_metadata(_transport.resolve_token(token, self.address))
        self._channel = _transport.sync_channel(self.address, tls)
        self._stub = pb_grpc.ExecutorStub(self._channel)
        self._approvals = pb_grpc.ApprovalsStub(self._channel)
        # Run records: start, append transitions, get, list, cancel, watch.
        self.runs = Runs(self._channel, self._metadata, self.address)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def list_tools(self) -> list[ToolSpec]:
        try:
            response = self._stub.ListTools(pb.ListToolsRequest(), metadata=self._metadata)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address) from exc
        return [wire.tool_spec(t) for t in response.tools]

    def list_providers(self) -> list[ProviderStatus]:
        """The MCP servers of the daemon's tools file and their state (`execgate doctor`)."""
        request = pb.ListProvidersRequest()
        try:
            response = self._stub.ListProviders(request, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address) from exc
        return [wire.provider_status(p) for p in response.providers]

    def stream(
        self,
        calls: Iterable[Call],
        *,
        run_id: str | None = None,
        batch_id: str = "",
        progress: bool = True,
        deadline: float | None = None,
        workspace: str | None = None,
        timeout: float | None = None,
    ) -> Iterator[Event]:
        """Every event of the batch as it happens: queued, started, finished.

        `timeout`: seconds this client waits for the stream (RequestError
        DEADLINE_EXCEEDED after); unlike `deadline` it stops nothing at the daemon.
        """
        request = wire.execute_request(
            calls, self._run(run_id), batch_id, not progress, deadline, self._space(workspace)
        )
        try:
            for msg in self._stub.Execute(request, metadata=self._metadata, timeout=timeout):
                yield wire.event(msg)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address) from exc

    def execute(
        self,
        calls: Iterable[Call],
        *,
        run_id: str | None = None,
        batch_id: str = "",
        deadline: float | None = None,
        workspace: str | None = None,
    ) -> list[Outcome]:
        """Run a batch (one model turn); the outcomes in the order the calls were given.

        `deadline` (time.time() seconds): calls still running then are stopped
        (timeout); calls not started by then are REJECTED (timeout).
        """
        request = wire.execute_request(
            calls, self._run(run_id), batch_id, True, deadline, self._space(workspace)
        )
        try:
            response = self._stub.ExecuteBatch(request, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address) from exc
        return wire.outcomes(response)

    def explain(
        self,
        calls: Iterable[Call],
        *,
        run_id: str | None = None,
        workspace: str | None = None,
    ) -> list[CallPlan]:
        """How the daemon would schedule these calls (locks, who waits for whom); runs nothing."""
        request = wire.execute_request(
            calls, self._run(run_id), "", True, workspace=self._space(workspace)
        )
        try:
            response = self._stub.Explain(request, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address) from exc
        return wire.call_plans(response)

    def explain_policy(
        self,
        tool: str,
        *,
        agent: str = "",
        groups: Iterable[str] = (),
        roles: Iterable[str] = (),
        paths: Iterable[str] = (),
        tables: Iterable[str] = (),
        hosts: Iterable[str] = (),
        arguments: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> PolicyExplanation:
        """How the policy the daemon enforces now would decide a described call, and
        every rule's verdict; nothing runs (`execgate policy explain`).

        `agent` "" is this client's identity with its own groups and roles; another's
        name, or any `groups`/`roles`, needs the operator, approver or admin role
        (PermissionDenied otherwise). `paths` are workspace-relative; `arguments` are
        the call's (for `when:` rules; "argv" for commands).
        """
        request = wire.explain_policy_request(
            tool,
            agent=agent,
            groups=groups,
            roles=roles,
            paths=paths,
            tables=tables,
            hosts=hosts,
            arguments=arguments,
        )
        try:
            response = self._stub.ExplainPolicy(request, metadata=self._metadata, timeout=timeout)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address) from exc
        return wire.policy_explanation(response)

    def run(self, call: Call, *, run_id: str | None = None) -> Outcome:
        return self.execute([call], run_id=run_id)[0]

    def execute_one(self, tool: str, /, **arguments: Any) -> Outcome:
        return self.run(Call(tool=tool, arguments=arguments))

    def get_call(
        self, call_id: str, *, run_id: str | None = None, include_raw: bool = False
    ) -> CallRecord:
        run = self._run(run_id)
        try:
            msg = self._stub.GetCall(
                pb.GetCallRequest(run_id=run, call_id=call_id, include_raw=include_raw),
                metadata=self._metadata,
            )
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address, run_id=run, call_id=call_id) from exc
        return wire.record(msg)

    def list_calls(
        self,
        *,
        run_id: str = "",
        statuses: Iterable[Status] = (),
        tool: str = "",
        limit: int = 100,
        since: float | None = None,
        finished_since: float | None = None,
        workspace: str = "",
    ) -> list[CallRecord]:
        """Newest first, following pages until `limit` records; `since`: calls created at
        or after this time (epoch seconds); `finished_since`: calls whose outcome was
        recorded at or after it."""
        records: list[CallRecord] = []
        token = ""
        while len(records) < limit:
            request = wire.list_request(
                run_id=run_id,
                statuses=statuses,
                tool=tool,
                limit=min(limit - len(records), 1000),
                page_token=token,
                since=since,
                finished_since=finished_since,
                workspace=workspace,
            )
            try:
                response = self._stub.ListCalls(request, metadata=self._metadata)
            except grpc.RpcError as exc:
                raise wire.translate(exc, self.address) from exc
            records.extend(wire.record(r) for r in response.calls)
            token = response.next_page_token
            if not token:
                break
        return records

    def cancel(
        self,
        *,
        call_id: str = "",
        batch_id: str = "",
        run_id: str | None = None,
        reason: str = "",
        grace: float | None = None,
        requester: str = "",
    ) -> list[str]:
        """Stop calls: one (call_id), a batch, or a whole run (run_id alone; no later
        call of that run starts). Returns the ids of the calls reached."""
        request = wire.cancel_request(
            run_id=self._run(run_id),
            call_id=call_id,
            batch_id=batch_id,
            reason=reason,
            grace=grace,
            requester=requester,
        )
        try:
            return list(self._stub.Cancel(request, metadata=self._metadata).call_ids)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address) from exc

    def approvals_pending(self) -> list[Approval]:
        """The approvals waiting for a decision, oldest first (approver, operator, admin)."""
        try:
            response = self._approvals.ListPending(pb.ListPendingRequest(), metadata=self._metadata)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address) from exc
        return [wire.approval(a) for a in response.approvals]

    def approvals_of_run(self, run_id: str) -> list[Approval]:
        """Every approval of the run in any state, oldest first: who decided, and when."""
        request = pb.ListApprovalsRequest(run_id=run_id)
        try:
            response = self._approvals.List(request, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address) from exc
        return [wire.approval(a) for a in response.approvals]

    def watch_approvals(self) -> Iterator[Approval]:
        """The pending approvals, then each one as it is created or decided."""
        try:
            for msg in self._approvals.Watch(pb.WatchApprovalsRequest(), metadata=self._metadata):
                yield wire.approval(msg)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address) from exc

    def approve(self, approval_id: str, comment: str = "") -> Approval:
        """Let a parked call run. PermissionDenied: not an approver of its rule, or its
        requester; ApprovalNotPending: unknown, decided or expired."""
        return self._decide(approval_id, True, comment)

    def deny(self, approval_id: str, comment: str) -> Approval:
        """Refuse a parked call: it ends REJECTED (approval_denied) with `comment`."""
        return self._decide(approval_id, False, comment)

    def _decide(self, approval_id: str, approve: bool, comment: str) -> Approval:
        request = pb.DecideRequest(approval_id=approval_id, approve=approve, comment=comment)
        try:
            msg = self._approvals.Decide(request, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise wire.translate(exc, self.address, approval_id=approval_id) from exc
        return wire.approval(msg)

    def _run(self, run_id: str | None) -> str:
        return self.run_id if run_id is None else run_id

    def _space(self, workspace: str | None) -> str:
        return self.workspace if workspace is None else workspace
