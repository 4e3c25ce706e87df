"""Tier 1: the bench's size arguments and iteration defaults (no MPI)."""
import pytest

from bench.sizes import format_size, parse_size, sweep


@pytest.mark.parametrize("text,expected", [("8", 8), ("64K", 65536), ("64k", 65536), ("256M", 256 << 20),
                                           ("1G", 1 << 30), ("4KiB", 4096), ("4KB", 4096), ("1.5K", 1536),
                                           (" 32 ", 32)])
def test_sizes_parse_with_binary_suffixes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "-8", "64X", "1.3", "0.1K", "8 bytes"])
def test_non_sizes_are_refused_with_the_text(text):
    with pytest.raises(ValueError, match="size|whole"):
        parse_size(text)


def test_default_sweep_is_powers_of_two_from_8_bytes_to_256_mib():
    sizes = sweep(8, 256 << 20, 2)
    assert sizes[0] == 8 and sizes[-1] == 256 << 20 and len(sizes) == 26
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))


def test_sweep_with_another_factor_stops_at_the_maximum():
    assert sweep(1000, 100000, 10) == [1000, 10000, 100000]
    assert sweep(8, 100, 4) == [8, 32]
    assert sweep(3, 10, 1.5) == [3, 4, 6]
    assert sweep(1, 3, 1.2) == [1, 2]   # no size repeats after rounding down


@pytest.mark.parametrize("args", [(0, 8, 2), (16, 8, 2), (8, 64, 1)])
def test_sweep_refuses_empty_or_endless_ranges(args):
    with pytest.raises(ValueError):
        sweep(*args)


@pytest.mark.parametrize("nbytes", [8, 1000, 1536, 4096, 64 << 20, 3 << 30])
def test_format_size_reads_back(nbytes):
    assert parse_size(format_size(nbytes)) == nbytes
