from conftest import Gateway, assert_error


def test_models_list_requires_key(gateway: Gateway) -> None:
    import httpx
    r = httpx.get(gateway.v1 + "/models")
    assert_error(r, 401, "invalid_api_key", "authentication_error")
