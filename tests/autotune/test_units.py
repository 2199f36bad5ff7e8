import pytest

from autotune.units import format_bytes, parse_size


@pytest.mark.parametrize(
    "text,value",
    [
        ("16GiB", 16 << 30),
        ("512MiB", 512 << 20),
        ("1.5GB", 1_500_000_000),
        ("1048576", 1 << 20),
        ("2 kib", 2048),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-3GiB", "0"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 << 20) == "3.00 MiB"
    assert format_bytes(5 << 40) == "5120.00 GiB"
