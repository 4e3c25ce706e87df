"""Tier 1: how buffers are cut into chunks and segments (pure, no MPI)."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from ring.partition import bounds_from_counts, chunk_bounds, segment_bounds

pytestmark = pytest.mark.quick   # (pure and fast: the ground every layer stands on)


@given(count=st.integers(0, 10_000), nranks=st.integers(1, 64))
def test_chunks_match_array_split_and_cover_the_buffer(count, nranks):
    bounds = chunk_bounds(count, nranks)
    assert len(bounds) == nranks
    assert bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))   # contiguous, no gap, no overlap
    expected = [len(part) for part in np.array_split(np.arange(count), nranks)]
    assert [stop - start for start, stop in bounds] == expected


@given(count=st.integers(0, 200), nranks=st.integers(1, 16))
def test_leftovers_go_first_and_sizes_differ_by_at_most_one(count, nranks):
    sizes = [stop - start for start, stop in chunk_bounds(count, nranks)]
    assert sizes == sorted(sizes, reverse=True)
    assert max(sizes) - min(sizes) <= 1


def test_fewer_elements_than_ranks_gives_empty_chunks():
    assert chunk_bounds(2, 5) == ((0, 1), (1, 2), (2, 2), (2, 2), (2, 2))
    assert chunk_bounds(0, 3) == ((0, 0), (0, 0), (0, 0))


@given(counts=st.lists(st.integers(0, 50), min_size=1, max_size=10))
def test_uneven_bounds_lay_chunks_end_to_end(counts):
    bounds = bounds_from_counts(counts)
    assert [stop - start for start, stop in bounds] == counts
    assert bounds[-1][1] == sum(counts)


@given(start=st.integers(0, 1000), length=st.integers(0, 1000), segment=st.integers(1, 300))
def test_segments_cover_a_chunk_in_bounded_pieces(start, length, segment):
    segments = segment_bounds((start, start + length), segment)
    covered = [i for a, b in segments for i in range(a, b)]
    assert covered == list(range(start, start + length))
    assert all(0 < b - a <= segment for a, b in segments)
