"""Unit tests of the sans-I/O RESP parser and encoder of the request path's Redis client."""
from extproc.resp import RespError, RespParser, encode


def test_encode() -> None:
    assert encode(("EVALSHA", "ab", 0, "x y")) == b"*4\r\n$7\r\nEVALSHA\r\n$2\r\nab\r\n$1\r\n0\r\n$3\r\nx y\r\n"
    assert encode((b"\x00\xff",)) == b"*1\r\n$2\r\n\x00\xff\r\n"


def test_parser_any_cut() -> None:
    wire = (b"+OK\r\n:42\r\n$5\r\nhello\r\n$-1\r\n*3\r\n$2\r\nok\r\n:7\r\n*2\r\n$1\r\na\r\n$-1\r\n"
            b"-NOSCRIPT No matching script\r\n*0\r\n")
    for step in (1, 2, 5, len(wire)):
        p = RespParser()
        out = []
        for i in range(0, len(wire), step):
            out += p.feed(wire[i:i + step])
        assert out[:6] == [b"OK", 42, b"hello", None, [b"ok", 7, [b"a", None]], out[5]]
        assert isinstance(out[5], RespError) and str(out[5]).startswith("NOSCRIPT")
        assert out[6] == [] and len(out) == 7
