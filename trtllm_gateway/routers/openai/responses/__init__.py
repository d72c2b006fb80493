"""POST /v1/responses (OpenAI's Responses API), GET and DELETE by id: a translator onto chat."""
