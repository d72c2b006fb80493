"""LLaVA-family vision for the built-in engine: vision tower + projector, image embeddings, and
their placement at the prompt's image-token positions."""
