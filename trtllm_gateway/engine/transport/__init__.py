"""The engine core's transport: the step loop behind ZMQ (messages, client, pipes, launchers,
stream),
in a process or a thread; it knows no engine (EngineCore lives in engine/builtin/core.py)."""
