"""The console: the customers' web application (sign-up, keys, usage, billing, members).

It runs as its own process (``python -m control.console``) on ``GATEWAY_CONSOLE_PORT`` beside the
gateway, on the same PostgreSQL and Redis, and changes keys and balances only through
``control.admin.Admin`` so the gateway sees every change at once.
"""
