"""OpenAI batch files: request lines in, OpenAI's output and error lines out."""
