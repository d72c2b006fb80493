"""The endpoints: the OpenAI API (openai/), the Anthropic Messages API (anthropic/), the sibling API
under /internal/ (internal/) and /health; each parses, runs through the engine protocol and
renders."""
