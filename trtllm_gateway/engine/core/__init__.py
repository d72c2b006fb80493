"""The engine core boundary: the built-in step loop behind ZMQ, in a process or a thread."""
