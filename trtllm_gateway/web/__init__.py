"""The HTTP kit the endpoints stand on: dependencies, errors in the caller's shape, SSE,
cancellation,
admission, metrics, tracing, auth, body limits; it knows no endpoint."""
