"""Host memory as a limit: TensorFlow's pinned host cap and the default limit."""

import pytest

import autotune.search.host
from autotune.search.host import (
    PINNED_ENV,
    default_host_memory,
    free_ram_bytes,
    pinned_cap_bytes,
    pinned_hint,
)


def test_pinned_cap_is_tensorflows_64_gib_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PINNED_ENV, raising=False)
    assert pinned_cap_bytes() == 64 << 30
    monkeypatch.setenv(PINNED_ENV, "100000")
    assert pinned_cap_bytes() == 100000 << 20
    monkeypatch.setenv(PINNED_ENV, "lots")
    with pytest.raises(ValueError, match=PINNED_ENV):
        pinned_cap_bytes()


def test_the_hint_names_the_variable_only_above_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PINNED_ENV, raising=False)
    assert pinned_hint(64 << 30) is None
    hint = pinned_hint(88 << 30)
    assert hint is not None and f"{PINNED_ENV}=" in hint
    mib = int(hint.split("=")[1].split()[0])
    assert mib << 20 >= 88 << 30  # enough for the plan


def test_default_limit_on_a_gpu_machine_is_the_smaller_of_ram_and_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert default_host_memory(gpu_visible=False) is None
    free = free_ram_bytes()
    assert free is not None and free > 0
    # the machine's free RAM moves between two reads (other processes): one reading here
    monkeypatch.setattr(autotune.search.host, "free_ram_bytes", lambda: free)
    monkeypatch.setenv(PINNED_ENV, "1024")
    assert default_host_memory(gpu_visible=True) == min(free, 1 << 30)
    monkeypatch.setenv(PINNED_ENV, str(1 << 30))  # 1 PiB: the RAM is smaller
    assert default_host_memory(gpu_visible=True) == free
