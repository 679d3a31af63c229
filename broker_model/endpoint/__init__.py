"""The gRPC endpoint: RocketMQ 5's client protocol (``apache.rocketmq.v2.MessagingService``, as its
proxy serves it) in front of brokers of the lake, so that the official clients produce into it.
See docs/endpoint.md.
"""

from __future__ import annotations

from broker_model.endpoint.server import EndpointConfig, serve
from broker_model.endpoint.service import MessagingService

__all__ = ["EndpointConfig", "MessagingService", "serve"]
