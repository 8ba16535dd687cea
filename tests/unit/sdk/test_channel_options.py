"""The channel and server options agree: the server permits the client's keepalive pings, and only
unary ProcessorService methods are retried."""

from __future__ import annotations

import json

from procmesh import SERVICE_NAME
from procmesh._client import KEEPALIVE_TIME_MS, SERVICE_CONFIG, channel_options
from procmesh._server import KEEPALIVE_MIN_PING_INTERVAL_MS, server_options
from procmesh.v1 import processor_pb2 as ppb


def test_the_server_permits_the_clients_keepalive_pings() -> None:
    client = dict(channel_options())
    server = dict(server_options())
    assert client["grpc.keepalive_time_ms"] == KEEPALIVE_TIME_MS
    assert client["grpc.keepalive_permit_without_calls"] == 1
    # pinging an idle connection is allowed, at the client's pace (else GOAWAY "too_many_pings")
    assert server["grpc.keepalive_permit_without_calls"] == 1
    assert server["grpc.http2.min_ping_interval_without_data_ms"] <= KEEPALIVE_TIME_MS
    assert server["grpc.http2.min_ping_interval_without_data_ms"] == KEEPALIVE_MIN_PING_INTERVAL_MS
    assert server["grpc.max_connection_age_ms"] > 0
    assert server["grpc.max_connection_age_grace_ms"] > 0


def test_every_unary_method_is_retried_on_unavailable_and_the_stream_never() -> None:
    assert json.loads(dict(channel_options())["grpc.service_config"]) == SERVICE_CONFIG
    assert dict(channel_options())["grpc.enable_retries"] == 1
    assert SERVICE_CONFIG["loadBalancingConfig"] == [{"round_robin": {}}]
    hooks, tools = SERVICE_CONFIG["methodConfig"]
    retried = {(n["service"], n["method"]) for config in (hooks, tools) for n in config["name"]}
    methods = ppb.DESCRIPTOR.services_by_name["ProcessorService"].methods
    unary = {(SERVICE_NAME, m.name) for m in methods if not (m.client_streaming or m.server_streaming)}
    assert retried == unary
    assert (SERVICE_NAME, "ProcessOutputStream") not in retried
    assert {"ProcessInput", "Describe"} <= {n["method"] for n in hooks["name"]}
    assert tools["name"] == [{"service": SERVICE_NAME, "method": "ExecuteTool"}]
    assert hooks["retryPolicy"]["maxAttempts"] == tools["retryPolicy"]["maxAttempts"] == 3
    # a hook the server cancelled is safe to repeat; a tool may have done part of its work
    assert hooks["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE", "CANCELLED"]
    assert tools["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
