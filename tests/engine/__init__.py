"""Built-in engine tests on the real default model."""
