"""What several test files share, one module per meaning (a test file imports none of another's
names: tests/test_layout.py). Nothing here runs as a test."""
