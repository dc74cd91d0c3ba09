"""The zip Lambda functions: one module per function, each a thin handler (parse, call, return)."""
