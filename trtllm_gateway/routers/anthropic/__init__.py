"""Anthropic's APIs, served by translation onto the OpenAI layer's chat pipeline."""
