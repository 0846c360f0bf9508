"""What a bus says while it recovers (a server gone, the client reconnecting, a stream electing a leader): worth
another try with the same message id; anything else (a subject no stream takes, a payload too large) is not."""

from __future__ import annotations

import nats.errors
import nats.js.errors

__all__ = ["TRANSIENT_BUS_ERRORS"]

TRANSIENT_BUS_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    TimeoutError,
)
