"""`execgate policy explain` against the daemon (the ExplainPolicy RPC).

Its own module so that the rest of `execgate policy` (check, test, explain --policy FILE)
never imports grpc.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import grpc

from execgate.client._transport import call_metadata, resolve_token, sync_channel
from execgate.client.wire import resolve_address, translate
from execgate.executor.policy.explain import Explanation
from execgate.executor.policy.local_identities import cli_token
from execgate.executor.server import wire
from execgate.v1 import executor_pb2 as pb
from execgate.v1 import executor_pb2_grpc as pb_grpc

from . import common


def explain_remote(args: argparse.Namespace, values: dict[str, Any]) -> Explanation:
    """Asked of the daemon (ExplainPolicy), against the policy it enforces now."""
    request = pb.ExplainPolicyRequest(
        tool=args.tool,
        agent=args.agent or "",
        groups=args.group,
        roles=args.role,
        paths=args.path,
        tables=args.table,
        hosts=args.host,
        arguments_json=json.dumps(values),
    )
    address = resolve_address(args.addr)
    token = args.token if args.token is not None else cli_token(address, "operator")
    metadata = call_metadata(resolve_token(token))
    with sync_channel(address, common.tls(args)) as channel:
        try:
            reply = pb_grpc.ExecutorStub(channel).ExplainPolicy(
                request, metadata=metadata, timeout=30
            )
        except grpc.RpcError as exc:
            raise translate(exc, address) from exc
    return wire.explanation_from(reply)
