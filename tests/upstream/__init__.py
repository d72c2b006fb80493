"""Other projects' KV event structs and publishers, transcribed field by field from their source at
a cited commit, so tests decode what the gateway sends the way those projects' readers do."""
