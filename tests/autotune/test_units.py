import pytest

from autotune.units import byte_unit, format_bytes, parse_size


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


def test_a_size_is_said_exactly_once_when_it_reads_in_bytes() -> None:
    from autotune.units import format_sized

    assert format_sized(931) == "931 B"
    assert format_sized(1024) == "1.00 KiB (1024 B)"


def test_bytes_are_plotted_in_the_unit_that_reads_as_a_number() -> None:
    # a 15 MB peak as 14.3 MiB, not 0.014 GiB
    assert byte_unit(15e6) == (float(1 << 20), "MiB")
    assert byte_unit(3 * 2.0**30) == (float(1 << 30), "GiB")
    assert byte_unit(4096) == (1024.0, "KiB") and byte_unit(512) == (1.0, "B")
