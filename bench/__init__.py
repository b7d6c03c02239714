"""`make bench`: the gateway against bare Envoy, a minimal ext_proc and LiteLLM on one fixed-reply upstream."""
