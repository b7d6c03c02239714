"""What the request path (extproc/), the control plane (control/) and the usage writer share: the catalog
and its prices, the endpoint registry and the pure request rules, the error table, the Redis key layout,
settings, URLs and the small clients all of them open.  It imports nothing of extproc/ or control/, and
they never import each other."""
