"""The workspace viewer (``alphaagent serve``): a read-only web UI of one user's work, over the local
backend or a deployed stack's S3 bucket and DynamoDB table. Starlette, Jinja2, markdown-it-py and nh3
come with the ``viewer`` extra and are imported only when the viewer starts."""
